"""Section 3 of lesson 14, inside the worker processes: all-reduce bandwidth against message size
(`exp_allreduce`, each size checked first), and how the first two GPUs are linked (`link_info`: CUDA's peer
access, NVML's NVLink state and PCIe topology, or a MIG slice's profile, which has neither).
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
import torch.distributed as dist

from gpulab.core.timing import benchmark
from gpulab.lessons.multigpu.arithmetic import Mismatch, algbw_gbps, busbw_gbps
from gpulab.lessons.multigpu.worker import Ctx, timing_dict


def link_info(devices: Sequence[int]) -> dict[str, Any]:
    """How two GPUs are connected, from CUDA (peer access) and NVML (NVLink, PCIe topology)."""
    from gpulab.core import monitor

    from gpulab.core.device import profile

    prof = profile()
    if prof is not None and not prof.p2p:
        return {"summary": f"a MIG slice ({prof.key}: {prof.mig}): no P2P or NVLink to another GPU, and one "
                           "slice per process; two slices talk through host memory (NCCL's SHM or sockets)",
                "peer_access": False, "nvlink_active": 0, "nvlink_p2p": False, "pcie_ancestor": None,
                "nvml": "not used: the profile says what a slice has"}
    if len(devices) < 2 or not torch.cuda.is_available():
        return {"summary": "gloo over loopback (CPU)", "peer_access": None, "nvlink_active": None,
                "nvlink_p2p": None, "pcie_ancestor": None, "nvml": "not used on the CPU"}
    a, b = devices[0], devices[1]
    info: dict[str, Any] = {"peer_access": bool(torch.cuda.can_device_access_peer(a, b)),
                            "nvlink_active": None, "nvlink_p2p": None, "pcie_ancestor": None}
    ok, why = monitor.nvml_status()
    info["nvml"] = why
    if ok:
        pynvml = monitor.import_pynvml()
        pynvml.nvmlInit()
        try:
            ha = monitor.nvml_handle(pynvml, torch.device("cuda", a))
            hb = monitor.nvml_handle(pynvml, torch.device("cuda", b))
            names = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches",
                     30: "a PCIe host bridge", 40: "the same CPU (NUMA node)", 50: "across CPU sockets (SYSTEM)"}
            with contextlib.suppress(pynvml.NVMLError):
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb)
                info["pcie_ancestor"] = names.get(int(level), str(level))
            with contextlib.suppress(pynvml.NVMLError, AttributeError):
                status = pynvml.nvmlDeviceGetP2PStatus(ha, hb, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                info["nvlink_p2p"] = status == pynvml.NVML_P2P_STATUS_OK
            active = 0
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active += pynvml.nvmlDeviceGetNvLinkState(ha, link) == pynvml.NVML_FEATURE_ENABLED
                except pynvml.NVMLError:
                    continue
            info["nvlink_active"] = active
        finally:
            pynvml.nvmlShutdown()
    if info["nvlink_p2p"] or info["nvlink_active"]:
        kind = f"NVLink ({info['nvlink_active']} links active on GPU {a})"
    elif info["nvml"] and not ok:
        kind = "unknown: NVML is not usable (" + why + ")"
    else:
        kind = "PCIe" + (f" through {info['pcie_ancestor']}" if info["pcie_ancestor"] else "")
    info["summary"] = f"{kind}; CUDA peer access {'yes' if info['peer_access'] else 'no'}"
    return info


def exp_allreduce(ctx: Ctx, sizes: Sequence[int], warmup: int, repeat: int) -> dict:
    """All-reduce (sum, fp32) bandwidth against message size; each size checked once first."""
    dev, n = ctx.device, ctx.world
    link = (link_info(list(range(min(n, torch.cuda.device_count())))) if dev.type == "cuda"
            else link_info([])) if ctx.rank == 0 else None
    expected = n * (n + 1) / 2
    rows = []
    for nbytes in sizes:
        t = torch.full((max(1, int(nbytes) // 4),), float(ctx.rank + 1), device=dev)
        dist.all_reduce(t)
        if not bool(torch.all(t == expected)):
            raise Mismatch(f"all-reduce of {nbytes} bytes: rank {ctx.rank} got values other than {expected}")
        t.zero_()            # zeros stay zeros: repeated sums cannot overflow while timing
        timing = benchmark(lambda: dist.all_reduce(t), warmup=warmup, repeat=repeat, device=dev)
        seconds = timing.median_ms / 1e3
        alg = algbw_gbps(t.numel() * 4, seconds)
        rows.append({"bytes": t.numel() * 4, **timing_dict(timing), "algbw_gbps": alg,
                     "busbw_gbps": busbw_gbps(alg, n)})
        del t
    return {"world": n, "rows": rows, "link": link}
