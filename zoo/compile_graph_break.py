"""A small GPT (4 layers, 6 heads, 384 wide, 256 tokens, vocab 8192, batch 16) under torch.compile, trained
in bf16 autocast with fused AdamW on token batches drawn on the GPU. Its forward keeps the norm of the
residual stream after every block for the training log, as a Python float (`.item()`). That breaks the
graph inside the loop over the blocks, where torch.compile cannot resume: it gives up on the whole
forward, which runs eagerly, and compiles only each block's own forward; every `.item()` also waits
for the GPU."""
import torch
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "compile_graph_breaks": "the norms kept as tensors (.detach() instead of .item()), read only when logged",
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs of each compiled region), '
                    "torch.compiler.cudagraph_mark_step_begin() before each step; the .item() calls left as they are",
}

SIZES = {"tiny": dict(vocab=512, layers=2, heads=2, width=64, seq=32, batch=4),
         "full": dict(vocab=8192, layers=4, heads=6, width=384, seq=256, batch=16)}


class LoggedGPT(GPT):
    """GPT whose forward records each block's output norm, to watch the activations grow."""

    keep_tensors = False

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        self.act_norms = []
        for block in self.blocks:
            x = block(x)
            if self.keep_tensors:
                self.act_norms.append(x.detach().norm())
            else:
                self.act_norms.append(x.norm().item())
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    model = LoggedGPT(V, cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    model.keep_tensors = fix == "compile_graph_breaks"
    graphs = fix == "launch_bound" and device.type == "cuda"
    compiled = torch.compile(model, backend=compile_backend(device), mode="reduce-overhead" if graphs else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        data = torch.randint(0, V, (B, T + 1), device=device, generator=g)
        k += 1
        x, y = reordered(perm, data[:, :-1], data[:, 1:])
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype):
            logits = compiled(x)
            loss = F.cross_entropy(logits.view(-1, V), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
