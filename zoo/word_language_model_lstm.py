"""PyTorch's word-level language model example (pytorch/examples, word_language_model/main.py, `train()`) with its
defaults: a 2-layer LSTM (embedding 200, hidden 200), 35-token BPTT windows of a corpus batched into 20
columns (`batchify`), fp32. Each step detaches the hidden state (`repackage_hidden`), runs the model, clips the
gradients to 0.25 and updates the weights by hand, one parameter at a time
(`for p in model.parameters(): p.data.add_(p.grad, alpha=-lr)`: no optimizer), and adds `loss.item()` to
the running loss for the log line, so the host waits for the GPU every step. Vocabulary 10,000 words
(Penn Treebank's, which the example's default data is); dropout (0.2) left out, as the zoo's correctness check
compares parameters."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, rows, setup

FIXES = {
    "host_sync": "total_loss kept on the GPU (total_loss += loss.detach()), read at the log interval (200 batches)",
    "launch_bound": GRAPHS_FIX,
    "fp32_matmuls": "the forward and loss in bf16 autocast",
}

SIZES = {"tiny": dict(vocab=500, emsize=16, nhid=16, nlayers=2, bptt=8, batch=4, tokens=20_000),
         "full": dict(vocab=10_000, emsize=200, nhid=200, nlayers=2, bptt=35, batch=20, tokens=1_000_000)}
LR, CLIP, LOG_INTERVAL = 20.0, 0.25, 200


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return F.log_softmax(self.decoder(output), dim=-1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = RNNModel(cfg["vocab"], cfg["emsize"], cfg["nhid"], cfg["nlayers"]).to(device)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)
    dtype = half_dtype(device, lstm=True)
    g = torch.Generator().manual_seed(seed)
    corpus = torch.randint(0, cfg["vocab"], (cfg["tokens"],), generator=g)
    nbatch = corpus.size(0) // cfg["batch"]                               # batchify
    train_data = corpus[:nbatch * cfg["batch"]].view(cfg["batch"], -1).t().contiguous().to(device)
    perm = rows(cfg["batch"], reorder)
    if perm is not None:                                                  # the columns are the batch's rows
        train_data = train_data[:, perm.to(device)]
    hidden = model.init_hidden(cfg["batch"])
    total_loss = torch.zeros((), device=device) if fix == "host_sync" else 0.0
    state = {"batch": 0, "total_loss": total_loss}

    def get_batch(source, i):
        seq_len = min(cfg["bptt"], len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)

    def step():
        nonlocal hidden
        i = (state["batch"] * cfg["bptt"]) % (train_data.size(0) - 1)
        data, targets = get_batch(train_data, i)
        hidden = tuple(h.detach() for h in hidden)                       # repackage_hidden
        model.zero_grad()
        mark()
        with torch.autocast(device.type, dtype=dtype, enabled=fix == "fp32_matmuls"):
            output, hidden = forward(data, hidden)
            loss = F.nll_loss(output.view(-1, cfg["vocab"]).float(), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR)
        if fix == "host_sync":
            state["total_loss"] += loss.detach()
            if state["batch"] % LOG_INTERVAL == 0 and state["batch"] > 0:
                state["cur_loss"] = state["total_loss"].item() / LOG_INTERVAL
                state["total_loss"].zero_()
        else:
            state["total_loss"] += loss.item()
            if state["batch"] % LOG_INTERVAL == 0 and state["batch"] > 0:
                state["cur_loss"], state["total_loss"] = state["total_loss"] / LOG_INTERVAL, 0.0
        state["batch"] += 1
        return loss.detach()

    step.model = model
    return step
