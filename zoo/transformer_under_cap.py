"""A language model built on torch.nn.TransformerEncoder (8 layers, d_model 1024, batch_first, causal
mask, bf16 autocast, fused AdamW, tokens on the GPU), in a script that shares its GPU and so limits
itself to 10 GiB of it with torch.cuda.set_per_process_memory_fraction, then picks the batch that fills
about 80 % of that cap (measured at a small batch and scaled)."""
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup

FIXES = {
    "memory_pressure": "activation checkpointing of each encoder layer "
                       "(torch.utils.checkpoint.checkpoint(layer, ..., use_reentrant=False))",
    "launch_bound": GRAPHS_FIX,
}

SIZES = {"tiny": dict(vocab=256, d=32, heads=4, layers=2, seq=16, batch=8),
         "full": dict(vocab=16384, d=1024, heads=16, layers=8, seq=512, batch=None)}
CAP_GIB = 10
FILL = 0.75
N_BATCHES = 4


class LM(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)
        self.checkpointing = False

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for layer in self.encoder.layers:
            if self.checkpointing:
                x = checkpoint(layer, x, self.mask, is_causal=True, use_reentrant=False)
            else:
                x = layer(x, self.mask, is_causal=True)
        return self.head(self.norm(x))


def fit_batch(model, cfg, cap, device, dtype):
    """The batch whose step peaks at FILL of the cap: one forward and backward at batch 4 and 8 (their
    peaks above the weights; batch 1 first, to set up cuBLAS), plus the weights and the two fp32 copies
    of them that AdamW will add."""
    base = torch.cuda.memory_allocated(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peaks = []
    for b in (1, 4, 8):
        torch.cuda.reset_peak_memory_stats(device)
        tokens = torch.zeros(b, cfg["seq"] + 1, dtype=torch.long, device=device)
        with torch.autocast("cuda", dtype=dtype):
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)
        peaks.append(torch.cuda.max_memory_allocated(device) - base)
    per_row = (peaks[2] - peaks[1]) / 4
    return max(1, int((FILL * cap - 3 * weights - (peaks[1] - 4 * per_row)) // per_row))   # weights + AdamW's two


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = dict(SIZES[scale])
    dtype = half_dtype(device)
    if device.type == "cuda":
        get = getattr(torch.cuda, "get_per_process_memory_fraction", None)   # torch >= 2.9
        before = get(device) if get else 1.0
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = min(before, CAP_GIB * 2**30 / total)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    model = LM(cfg["vocab"], cfg["d"], cfg["heads"], cfg["layers"], cfg["seq"]).to(device)
    if cfg["batch"] is None:
        cfg["batch"] = fit_batch(model, cfg, fraction * total, device, dtype) if device.type == "cuda" else 8
    model.checkpointing = fix == "memory_pressure"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")

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
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def close():
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(before, device)

    step.model = model
    step.close = close
    step.batch = B
    return step
