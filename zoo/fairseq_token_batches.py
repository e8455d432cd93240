"""A transformer language model trained the way fairseq's Trainer runs it (facebookresearch/fairseq,
fairseq/trainer.py, `train_step`; fairseq/optim/adam.py): batches built to a token budget (`--max-tokens 4096`,
sentences of similar length batched together, `--required-batch-size-multiple 8`), so each batch has its own
number of rows and its own length; the loss summed over the tokens and the gradients divided by the batch's
token count (`multiply_grads(1 / sample_size)`); `clip_grad_norm` computing the gradient norm every step and
`if not torch.isfinite(grad_norm).all(): raise FloatingPointError("gradients are Nan/Inf")`, a branch on a value
the GPU computed; fairseq's own Adam (decoupled weight decay, one parameter at a time in a Python loop, as
fairseq uses it when apex's FusedAdam is not installed); the inverse-square-root schedule setting the learning
rate every update. A decoder of 4 layers, 8 heads, 512 wide (the zoo's GPT, SDPA attention), vocab 8000,
bf16 autocast."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "varying_shapes": "each batch padded to a few shapes (rows to a multiple of 16 with empty sentences, length to a "
                      "multiple of 32; padding is ignored by the loss) and the model under CUDA graphs: "
                      'torch.compile(model, mode="reduce-overhead") (CPU: the plain compile)',
    "host_sync": "the gradient norm checked on the GPU: torch._assert_async(torch.isfinite(grad_norm).all())",
    "optimizer_unfused": "torch.optim.AdamW(..., fused=True) with the same betas, eps and weight decay",
    "launch_bound": GRAPHS_FIX + "; the batches' shapes left as they are",
}

SIZES = {"tiny": dict(vocab=500, layers=2, heads=2, width=32, max_len=64, tokens=256, median=12, rows=4, length=8),
         "full": dict(vocab=8000, layers=4, heads=8, width=512, max_len=256, tokens=4096, median=40, rows=16,
                      length=32)}
PAD = 1
LR, WARMUP = 5e-4, 4000


class Adam(torch.optim.Optimizer):
    """fairseq's Adam (fairseq/optim/adam.py): one parameter at a time, weight decay decoupled."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                beta1, beta2 = group["betas"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = exp_avg_sq.sqrt().add_(group["eps"])
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                step_size = group["lr"] * math.sqrt(bias_correction2) / bias_correction1
                if group["weight_decay"] != 0:
                    p.add_(p, alpha=-group["weight_decay"] * group["lr"])
                p.addcdiv_(exp_avg, denom, value=-step_size)


def token_batch(seed, k, cfg):
    """Batch k: sentences of one length bucket, as many as fit the token budget (a multiple of 8 rows)."""
    r = rng(seed, k)
    length = int(np.clip(r.lognormal(np.log(cfg["median"]), 0.5), 6, cfg["max_len"] - 1))
    n = max(8, cfg["tokens"] // length // 8 * 8)
    lengths = np.clip(length - r.integers(0, max(length // 8, 1), n), 4, None)
    tokens = np.full((n, length + 1), PAD, dtype=np.int64)
    for i, m in enumerate(lengths):
        tokens[i, :m + 1] = r.integers(PAD + 1, cfg["vocab"], m + 1)
    return torch.from_numpy(tokens)


def padded(tokens, cfg):
    n, t = tokens.shape
    rows_, length = -(-n // cfg["rows"]) * cfg["rows"], -(-(t - 1) // cfg["length"]) * cfg["length"] + 1
    out = torch.full((rows_, min(length, cfg["max_len"] + 1)), PAD, dtype=tokens.dtype)
    out[:n, :t] = tokens
    return out


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = GPT(cfg["vocab"], cfg["layers"], cfg["heads"], cfg["width"], cfg["max_len"], device=device)
    if fix == "optimizer_unfused":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4,
                                fused=True)
    else:
        opt = Adam(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4)
    graphs = fix in ("varying_shapes", "launch_bound")
    forward, mark = reduce_overhead(model, device) if graphs else (model, lambda: None)
    dtype = half_dtype(device)
    state = {"updates": 0}

    def step():
        k = state["updates"]
        tokens = token_batch(seed, k, cfg)
        if fix == "varying_shapes":
            tokens = padded(tokens, cfg)
        sample = tokens.to(device)
        sample = reordered(rows(sample.shape[0], reorder), sample)
        src, target = sample[:, :-1], sample[:, 1:]
        ntokens = int((tokens[:, 1:] != PAD).sum())                 # the collater counts them on the host
        for group in opt.param_groups:                               # inverse_sqrt's step_update
            group["lr"] = LR * min((k + 1) / WARMUP, math.sqrt(WARMUP / (k + 1)))
        mark()
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(src)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1),
                                   ignore_index=PAD, reduction="sum", label_smoothing=0.1)
        loss.backward()
        for p in model.parameters():                                 # multiply_grads(1 / sample_size)
            if p.grad is not None:
                p.grad.mul_(1.0 / ntokens)
        grads = [p.grad for p in model.parameters() if p.grad is not None]      # clip_grad_norm, --clip-norm 0
        grad_norm = torch.norm(torch.stack([torch.norm(g, p=2, dtype=torch.float32) for g in grads]))
        if fix == "host_sync":
            torch._assert_async(torch.isfinite(grad_norm).all())
        elif not torch.isfinite(grad_norm).all():
            raise FloatingPointError("gradients are Nan/Inf")
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["updates"] += 1
        return loss.detach()

    step.model = model
    return step
