"""A small GPT language model (2 layers, 4 heads, 256 wide, 128 tokens, vocab 4096, batch 8) trained on
padded token batches drawn on the GPU, in bf16 autocast with fused AdamW. The model's forward takes the
targets and returns the loss, nanoGPT style, and is compiled with torch.compile(mode="reduce-overhead")
because the step is small: launching its kernels one by one costs more than running them. The forward
marks the padding in the targets as ignored in place (`targets.masked_fill_(targets == PAD, -100)`), so
the compiled graph mutates an input it did not allocate, and inductor does not use its CUDA graphs for it
("skipping cudagraphs due to mutated inputs"). Kept out of the rules' development: added after run H,
labelled and diagnosed first in one run."""
import torch
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "cudagraphs_skipped": "the padding marked out of place, targets = targets.masked_fill(...), so the graphs are used",
}

SIZES = {"tiny": dict(vocab=128, layers=1, heads=2, width=32, seq=16, batch=4),
         "full": dict(vocab=4096, layers=2, heads=4, width=256, seq=128, batch=8)}
PAD = 0


class GPTWithLoss(GPT):
    """GPT whose forward takes the targets and returns the mean cross-entropy over the tokens that are not padding."""

    in_place = True

    def forward(self, idx, targets):
        logits = super().forward(idx)
        if self.in_place:
            targets.masked_fill_(targets == PAD, -100)
        else:
            targets = targets.masked_fill(targets == PAD, -100)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    model = GPTWithLoss(V, cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    model.in_place = fix != "cudagraphs_skipped"
    mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
    compiled = torch.compile(model, backend=compile_backend(device), mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        data = torch.randint(1, V, (B, T + 1), device=device, generator=g)
        lengths = torch.randint(T // 2, T + 2, (B, 1), device=device, generator=g)     # each row's real tokens
        data = data.masked_fill(torch.arange(T + 1, device=device) >= lengths, PAD)   # the rest is padding
        k += 1
        x, y = reordered(perm, data[:, :-1], data[:, 1:].contiguous())
        with torch.autocast(device.type, dtype=dtype):
            loss = compiled(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
