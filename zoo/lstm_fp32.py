"""An LSTM language model (embedding 1024, a 2-layer nn.LSTM of 1024 hidden units, batch_first, a linear
head over a 10,000-word vocabulary), sequences of 128 tokens, batch 64, trained in fp32 with PyTorch's
defaults and Adam; the token stream is already on the GPU."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup

FIXES = {
    "fp32_matmuls": "the forward and loss in bf16 autocast",
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.Adam(..., fused=True)",
}

SIZES = {"tiny": dict(vocab=100, d=32, layers=2, seq=16, batch=8),
         "full": dict(vocab=10000, d=1024, layers=2, seq=128, batch=64)}
N_BATCHES = 4


class LSTMLM(nn.Module):
    def __init__(self, vocab, d, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, layers, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = LSTMLM(cfg["vocab"], cfg["d"], cfg["layers"]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3,
                           fused=True if fix == "optimizer_unfused" else None)
    dtype = half_dtype(device, lstm=True)

    B, T = cfg["batch"], cfg["seq"]
    g = torch.Generator(device=device).manual_seed(seed)
    data = torch.randint(0, cfg["vocab"], (N_BATCHES * B, T + 1), device=device, generator=g)
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        tokens = reordered(perm, data[(k % N_BATCHES) * B:(k % N_BATCHES + 1) * B])
        k += 1
        mark()
        with torch.autocast(device.type, dtype=dtype, enabled=fix == "fp32_matmuls"):
            logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    step.model = model
    return step
