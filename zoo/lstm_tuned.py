"""The LSTM language model (embedding 1024, a 2-layer nn.LSTM of 1024, batch_first, a linear head over
10,000 words) trained in bf16 autocast with fused Adam at batch 256, sequences of 128 tokens already on
the GPU: cuDNN's LSTM kernels and large matrix products."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rows, setup

FIXES = {
    "launch_bound": "torch.compile(model) (Dynamo runs nn.LSTM itself eagerly: it compiles around it)",
}

SIZES = {"tiny": dict(vocab=100, d=32, layers=2, seq=16, batch=8),
         "full": dict(vocab=10000, d=1024, layers=2, seq=128, batch=256)}
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
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    dtype = half_dtype(device, lstm=True)
    forward = torch.compile(model, backend=compile_backend(device)) if fix == "launch_bound" else model

    B, T = cfg["batch"], cfg["seq"]
    g = torch.Generator(device=device).manual_seed(seed)
    data = torch.randint(0, cfg["vocab"], (N_BATCHES * B, T + 1), device=device, generator=g)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        tokens = reordered(perm, data[(k % N_BATCHES) * B:(k % N_BATCHES + 1) * B])
        k += 1
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    step.model = model
    return step
