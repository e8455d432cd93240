"""What a new shape costs in eager PyTorch on the lent GPU (issue 41: fairseq_token_batches and
hf_trainer_dynamic_padding as written take 100-170 ms in a step that meets a shape for the first time, on one H100,
2026-12-07): (1) one op at a time, the first call at a new size against the second, gpulab's `stopwatch` (host
clock, the device synchronized on both sides; results/zoo/2026-12-07-h100-issue41-i/ was made by ed4a171's copy, its
own loop); (2) the zoo's fairseq step, profiled at a repeated shape and at a new one, its ops by self CPU time.
usage: python scripts/device/new_shape_cost.py OUT.json"""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "zoo"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gpulab.core.timing import stopwatch  # noqa: E402

dev = torch.device("cuda")


def twice(fn, *args):
    out = []
    for _ in range(2):
        with stopwatch(device=dev) as call:
            fn(*args)
        out.append(call.ms)
    return out


def ops() -> list:
    rows = []
    torch.backends.cuda.matmul.allow_tf32 = False
    w = torch.randn(512, 512, device=dev, dtype=torch.bfloat16, requires_grad=True)
    for T in (37, 41, 53):
        q = torch.randn(96, 8, T, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
        keep = torch.ones(96, T, dtype=torch.bool, device=dev)
        keep[:, -3:] = False
        x = torch.randn(96 * T, 512, device=dev, dtype=torch.bfloat16, requires_grad=True)
        cases = {
            "sdpa causal fwd+bwd": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward(),
            "sdpa masked fwd+bwd": lambda: F.scaled_dot_product_attention(
                q, q, q, attn_mask=keep[:, None, None, :]).sum().backward(),
            "linear fwd+bwd": lambda: (x @ w).sum().backward(),
            "cross_entropy fwd+bwd": lambda: F.cross_entropy(x.float(), torch.zeros(96 * T, dtype=torch.long,
                                                                                    device=dev)).backward(),
        }
        for name, fn in cases.items():
            first, second = twice(fn)
            rows.append({"op": name, "T": T, "first_ms": first, "second_ms": second})
            print(f"{name:24s} T={T}: first {first:8.2f} ms, second {second:6.2f} ms")
    return rows


def fairseq_profile() -> dict:
    import fairseq_token_batches as m
    batches = [m.token_batch(0, k, m.SIZES["full"]) for k in range(40)]
    order = iter([batches[0]] * 4 + [batches[0], batches[7]])
    m.token_batch = lambda seed, k, cfg: next(order)
    step = m.make_step(None, scale="full", device=dev)
    for _ in range(4):
        step()
    out = {}
    for label in ("repeated shape " + "x".join(map(str, batches[0].shape)),
                  "new shape " + "x".join(map(str, batches[7].shape))):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with stopwatch(device=dev) as call:
                step()
        ms = call.ms
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
        out[label] = {"ms": ms, "top": [(e.key, e.self_cpu_time_total / 1e3, e.count) for e in top]}
        print(f"fairseq step, {label}: {ms:.1f} ms (profiled); top ops by self CPU time:")
        for key, self_ms, count in out[label]["top"]:
            print(f"   {self_ms:8.2f} ms  {count:5d}x  {key}")
    return out


if __name__ == "__main__":
    result = {"kind": "gpulab zoo new-shape cost (scripts/device/new_shape_cost.py)",
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "ops": ops(), "fairseq": fairseq_profile()}
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
