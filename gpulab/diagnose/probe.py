"""The kernel names this GPU uses for the math-mode tables of `gpulab.diagnose.kernels`
(`python -m gpulab.diagnose.zoo probe --out F`)."""
from __future__ import annotations

import torch


def probe_kernels(device: torch.device) -> dict:
    """The kernel names of fp32 (IEEE and TF32), bf16 and fp16 matrix products and convolutions (NCHW and
    NHWC), SDPA, and fused / foreach AdamW on this GPU: what analyze's name tables must recognise."""
    from gpulab.core.timing import gpu_profile

    from gpulab.models.precision import fp32_math

    def names(fn) -> list[str]:
        fn()
        torch.cuda.synchronize()
        with gpu_profile() as prof:
            fn()
            torch.cuda.synchronize()
        return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})

    a = torch.randn(1024, 1024, device=device)
    x = torch.randn(32, 64, 56, 56, device=device)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(device)
    out = {}
    for mode in ("ieee", "tf32"):
        with fp32_math(mode):
            out[f"mm fp32 {mode}"] = names(lambda: a @ a)
            out[f"conv fp32 {mode}"] = names(lambda: conv(x).sum().backward())
    for dt in (torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=dt):
            out[f"mm {dt}"] = names(lambda: a @ a)
            out[f"conv {dt} nchw"] = names(lambda: conv(x).sum().backward())
            xl, cl = x.to(memory_format=torch.channels_last), conv.to(memory_format=torch.channels_last)
            out[f"conv {dt} nhwc"] = names(lambda: cl(xl).sum().backward())
    q = torch.randn(8, 12, 1024, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    out["sdpa bf16"] = names(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward())
    lstm = torch.nn.LSTM(256, 256, batch_first=True).to(device)
    out["lstm fp32"] = names(lambda: lstm(torch.randn(16, 32, 256, device=device))[0].sum().backward())
    for fused in (False, True):
        p = [torch.nn.Parameter(torch.randn(1024, 1024, device=device)) for _ in range(4)]
        for t in p:
            t.grad = torch.randn_like(t)
        opt = torch.optim.AdamW(p, fused=fused)
        out[f"adamw fused={fused}"] = names(opt.step)
    return out
