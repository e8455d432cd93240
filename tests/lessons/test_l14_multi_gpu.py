"""gpulab.lessons.l14_multi_gpu and its parts (gpulab.lessons.multigpu): arithmetic, the correctness checks,
placement(), and real launches with gloo on 2 CPU processes at the tiny size (each launch costs ~3 s of process
start-up)."""
from __future__ import annotations

import math
import time

import pytest
import torch

from gpulab.lessons import l14_multi_gpu as D
from gpulab.lessons.multigpu import arithmetic as A
from gpulab.lessons.multigpu import ddp as DDP

TINY = D.SIZES["tiny"]


# -- arithmetic ---------------------------------------------------------------------------
def test_bus_bandwidth_follows_nccl_tests():
    assert A.algbw_gbps(2e9, 0.5) == pytest.approx(4.0)
    assert A.busbw_gbps(100.0, 2) == pytest.approx(100.0)        # 2(n-1)/n = 1
    assert A.busbw_gbps(100.0, 8) == pytest.approx(175.0)        # 2 * 7 / 8
    assert A.busbw_gbps(100.0, 1) == 0.0                          # nothing to move
    assert A.ring_bytes_per_gpu(1000, 4) == pytest.approx(1500)
    assert A.dp_bytes_gpu0(1000, 4) == 1000            # NCCL broadcast and reduce: once each way through GPU 0
    assert A.dp_bytes_gpu0(1000, 8) == 1000 and A.dp_bytes_gpu0(1000, 1) == 0
    with pytest.raises(ValueError):
        A.busbw_gbps(1.0, 0)
    with pytest.raises(ValueError):
        A.algbw_gbps(1.0, 0.0)


def test_bubble_formula_and_measurement():
    assert A.bubble_fraction(2, 1) == pytest.approx(0.5)
    assert A.bubble_fraction(2, 8) == pytest.approx(1 / 9)
    assert A.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert A.bubble_fraction(1, 5) == 0.0
    assert A.measured_bubble(busy_ms=5.0, wall_ms=10.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        A.bubble_fraction(2, 0)
    with pytest.raises(ValueError):
        A.measured_bubble(1.0, 0.0)


def test_overlap_fraction_is_clipped():
    assert A.overlap_fraction(10.0, 4.0, 10.0) == pytest.approx(1.0)       # fully hidden
    assert A.overlap_fraction(10.0, 4.0, 14.0) == pytest.approx(0.0)       # serial
    assert A.overlap_fraction(10.0, 4.0, 12.0) == pytest.approx(0.5)
    assert A.overlap_fraction(10.0, 4.0, 20.0) == 0.0                      # worse than serial
    assert A.overlap_fraction(10.0, 4.0, 8.0) == 1.0                       # noise below compute
    assert A.overlap_fraction(10.0, 0.0, 10.0) is None


# -- the overlap rule on synthetic timelines (issue 40, notebook 14 cell 32) ---------------------------------
def ddp_step_timelines(compute_ms=10.0, copy_ms=2.0, comm_ms=3.0, buckets=4, comm="during", slowdown_ms=0.0):
    """GPU kernels (name, start us, end us) of one step of a GPU-bound DDP model, as three timelines: compute only;
    DDP without communication (backward's compute in `buckets` equal parts, each followed on the same stream by
    its bucket's copy, DDP's own work); the DDP step (as before, plus each bucket's all-reduce on NCCL's stream,
    from the end of its copy while backward goes on, "during", or all of them after backward, "after").
    `slowdown_ms`: what the all-reduces beside them cost backward's later parts (SMs and memory they share)."""
    part, cp, ar = compute_ms * 1e3 / buckets, copy_ms * 1e3 / buckets, comm_ms * 1e3 / buckets

    def stream(with_copies: bool, slow: float):
        t, out, ends = 0.0, [], []
        for i in range(buckets):
            extra = slow * 1e3 / (buckets - 1) if i else 0.0      # parts after the first all-reduce started
            out.append(("gemm", t, t + part + extra))
            t += part + extra
            if with_copies:
                out.append(("direct_copy_kernel", t, t + cp))
                t += cp
            ends.append(t)
        return out, ends

    compute, _ = stream(False, 0.0)
    silent, _ = stream(True, 0.0)
    ddp, ready = stream(True, slowdown_ms if comm == "during" else 0.0)
    t = 0.0 if comm == "during" else ready[-1]
    for i in range(buckets):
        t = max(t, ready[i])
        ddp.append(("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t, t + ar))
        t += ar
    return compute, silent, ddp


def wall_ms(kernels) -> float:
    """A GPU-bound step's time: from its first kernel's start to its last kernel's end."""
    return (max(b for _, _, b in kernels) - min(a for _, a, _ in kernels)) / 1e3


def hidden_and_old(timelines, comm_ms=3.0):
    compute, silent, ddp = (wall_ms(k) for k in timelines)
    return A.overlap_fraction(silent, comm_ms, ddp), A.overlap_fraction(compute, comm_ms, ddp)


def test_an_all_reduce_hidden_beside_backward_reads_as_hidden_though_ddp_copies_its_buckets():
    """The case of the course's two H200s: a short all-reduce (NVLink) that runs beside backward, and DDP's bucket
    copies taking most of its length. Against compute only the copies count as communication not hidden, and the
    old rule read 0.08 (a FAIL by design); against DDP without communication it reads what the timeline shows."""
    timelines = ddp_step_timelines()         # 4 buckets: the last bucket's all-reduce alone runs after backward
    hidden, old = hidden_and_old(timelines)
    beside = A.kernel_breakdown(timelines[2])
    assert hidden == pytest.approx(0.75) == pytest.approx(beside["nccl_beside_compute_ms"] / beside["nccl_ms"])
    assert hidden >= A.HIDDEN_LOW > old and old == pytest.approx(0.25 / 3)


def test_the_hidden_share_at_its_edges():
    serial = ddp_step_timelines(comm="after")          # every all-reduce after backward
    assert hidden_and_old(serial) == (0.0, 0.0)
    assert A.kernel_breakdown(serial[2])["nccl_beside_compute_ms"] == 0.0
    half = ddp_step_timelines(buckets=2)               # the second of two all-reduces runs alone: half hidden
    assert hidden_and_old(half)[0] == pytest.approx(0.5) == pytest.approx(A.HIDDEN_LOW)   # the check's bound: passes
    assert hidden_and_old(ddp_step_timelines(buckets=2, copy_ms=2.1))[0] == pytest.approx(0.5)   # copies don't move it
    hidden, _ = hidden_and_old(ddp_step_timelines(buckets=2, slowdown_ms=0.03))
    assert hidden == pytest.approx(0.49) and hidden < A.HIDDEN_LOW      # 0.03 ms more paid: just under, FAIL
    # beside backward, but backward slowed by what it hid: the step paid for it, and the rule says so
    contended = ddp_step_timelines(slowdown_ms=2.25)
    assert hidden_and_old(contended)[0] == pytest.approx(0.0, abs=1e-9)
    assert A.kernel_breakdown(contended[2])["nccl_beside_compute_ms"] > 0      # what the profile shows instead


def test_bucket_layout_matches_ddp():
    # 8 Linear(64, 64): weight 16384 B, bias 256 B; DDP's rebuilt buckets at a 0.02 MiB cap were
    # 4 x 33280 B and at 0.05 MiB 2 x 66560 B (read from DDP's logging data, torch 2.13, gloo).
    sizes = [16384, 256] * 8
    assert A.bucket_layout(sizes, int(0.02 * A.MiB)) == [33280] * 4
    assert A.bucket_layout(sizes, int(0.05 * A.MiB)) == [66560] * 2
    assert A.bucket_layout(sizes, 10**9) == [sum(sizes)]
    assert A.bucket_layout([10, 500, 10], 100) == [510, 10]   # a parameter larger than the cap stays whole
    bufs = DDP.bucket_buffers([400, 8], torch.device("cpu"))
    assert [b.numel() for b in bufs] == [100, 2]


def test_kernel_kinds_and_breakdown():
    assert A.kernel_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "nccl"
    assert A.kernel_kind("Memcpy DtoD (Device -> Device)") == "copy"
    assert A.kernel_kind("void at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)") == "copy"
    assert A.kernel_kind("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>") == "copy"
    assert A.kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "compute"
    # two steps (us): compute 0-100 and 150-200, a copy 100-110, NCCL 50-130 and 190-260
    kernels = [("gemm", 0, 100), ("gemm", 150, 200), ("copy_kernel", 100, 110),
               ("ncclDevKernel_AllReduce", 50, 130), ("ncclDevKernel_AllReduce", 190, 260)]
    b = A.kernel_breakdown(kernels, steps=2)
    assert b["compute_ms"] == pytest.approx(0.150 / 2) and b["copy_ms"] == pytest.approx(0.010 / 2)
    assert b["nccl_ms"] == pytest.approx(0.150 / 2)
    assert b["nccl_beside_compute_ms"] == pytest.approx((60 + 10) / 1e3 / 2)     # 50-110 and 190-200
    assert b["busy_ms"] == pytest.approx((130 + 110) / 1e3 / 2) and b["kernels"] == 2.5       # 0-130, 150-260
    assert A.kernel_breakdown([], 1)["nccl_beside_compute_ms"] == 0.0


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_profile_of_ddp_steps_runs_every_step_even_when_the_profiler_fails(monkeypatch):
    # Without CUDA the profiler refuses a CUDA-only activity list; the steps (collectives, in DDP) must
    # still run on this rank as on the others, and the failure comes back as a message.
    if torch.cuda.is_available():
        pytest.skip("exercises the path where CUDA profiling is unavailable")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = {"a": 0, "b": 0}
    res = DDP.profile_steps_of({"a": lambda: calls.__setitem__("a", calls["a"] + 1),
                              "b": lambda: calls.__setitem__("b", calls["b"] + 1)}, 3, torch.device("cpu"))
    assert calls == {"a": 4, "b": 4} and "error" in res


def test_micro_batch_check():
    A.check_micro_batches(8, 4)
    with pytest.raises(ValueError, match="divide"):
        A.check_micro_batches(8, 3)


def test_grad_check_catches_a_broken_gradient():
    torch.manual_seed(0)
    ref = [torch.randn(50, 50), torch.randn(50)]
    assert A.check_grads([g.clone() for g in ref], ref, 1e-5, "same") == 0.0
    broken = [g.clone() for g in ref]
    broken[1][3] += 1e-3 * math.sqrt(sum(float((g ** 2).sum()) for g in ref))
    with pytest.raises(A.Mismatch, match="broken"):
        A.check_grads(broken, ref, 1e-5, "broken")
    with pytest.raises(A.Mismatch):            # NaN never passes
        A.check_grads([g * float("nan") for g in ref], ref, 1e-5, "nan")


# -- plan -----------------------------------------------------------------------------------
def _gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_plan_two_gpus(monkeypatch):
    _gpus(monkeypatch, 2)
    p = D.placement()
    assert (p.backend, p.nproc, p.device, p.size) == ("nccl", 2, "cuda", "full")
    assert (p.dp_device, p.dp_gpus, p.dp_backend) == ("cuda", 2, "nccl")
    assert p.notes == () and p.dp_joins_suite


def test_plan_one_gpu(monkeypatch):
    _gpus(monkeypatch, 1)
    p = D.placement()
    assert (p.backend, p.nproc, p.device, p.size) == ("gloo", 2, "cpu", "tiny")
    assert (p.dp_device, p.dp_gpus, p.dp_size) == ("cuda", 1, "full")
    assert any("needs 2 or more GPUs" in n for n in p.notes)
    assert "GPUs visible: 1" in p.describe()
    assert not p.dp_joins_suite               # DataParallel on the GPU, the processes on the CPU


def test_plan_no_gpu_and_forced_cpu(monkeypatch):
    _gpus(monkeypatch, 0)
    p = D.placement()
    assert (p.backend, p.device, p.dp_device, p.dp_gpus, p.dp_backend) == ("gloo", "cpu", "cpu", 0, "gloo")
    assert p.dp_joins_suite
    _gpus(monkeypatch, 4)
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")          # honoured: the CPU path on a GPU machine
    p = D.placement()
    assert (p.gpus, p.backend, p.size) == (0, "gloo", "tiny")


# -- real launches (gloo, 2 CPU processes) ----------------------------------------------------
def test_launch_success():
    res = D.launch("hello", 2, "gloo", timeout_s=60)
    assert res["sum"] == res["expected"] == 3.0
    assert [r["rank"] for r in res["ranks"]] == [0, 1]
    assert res["world_size"] == 2 and res["launch_s"] > res["work_s"]


def test_launch_failure_is_explained():
    with pytest.raises(D.LaunchError, match=r"rank 1: ValueError: rank 1 was asked to fail"):
        D.launch("hello", 2, "gloo", timeout_s=60, fail=True)


def test_launch_timeout_stops_the_processes():
    t0 = time.perf_counter()
    with pytest.raises(D.LaunchError, match="did not finish within 2 s"):
        D.launch("hello", 2, "gloo", timeout_s=2, sleep_s=30)
    assert time.perf_counter() - t0 < 20


def test_launch_refuses_bad_arguments():
    with pytest.raises(ValueError, match="unknown experiment"):
        D.launch("nope", 2, "gloo")
    with pytest.raises(ValueError, match="backend"):
        D.launch("hello", 2, "mpi")


def test_ddp_check_catches_a_missing_all_reduce():
    # corrupt=True: rank 0 keeps its own gradient (no all-reduce); the check must fail.
    with pytest.raises(D.LaunchError, match="Mismatch: DDP over 2 processes"):
        D.launch("ddp", 2, "gloo", timeout_s=90, model=TINY["model"], batch=TINY["batch"], warmup=1, repeat=1,
                 buckets_mb=[None], accum_steps=2, accum_micro=1, corrupt=True)


def test_ddp_experiment_on_two_cpu_processes():
    res = D.launch("ddp", 2, "gloo", timeout_s=90, model=TINY["model"], batch=TINY["batch"], warmup=1, repeat=2,
                   buckets_mb=[0.01, None], accum_steps=2, accum_micro=1)
    assert set(res["checks"]) == {"DDP step", "2 micro-steps with no_sync", "2 micro-steps without no_sync"}
    assert all(d <= res["tol"] for d in res["checks"].values())
    assert [b["label"] for b in res["buckets"]] == ["0.01 MiB", "whole model"]
    assert res["buckets"][0]["n_buckets"] > 1 and res["buckets"][1]["n_buckets"] == 1
    for b in res["buckets"]:                  # DDP without its all-reduce (noop_hook) timed beside the rest
        assert b["no_comm_ms"] > 0 and 0.0 <= b["hidden"] <= 1.0 and 0.0 <= b["overlap"] <= 1.0
    assert len(res["step_ms_by_rank"]) == 2 and D.samples_per_s(res["throughput"]) > 0


def test_bucket_panel_experiment_checks_gradients_with_bucket_views():
    res = D.launch("buckets", 2, "gloo", timeout_s=90, model=TINY["model"], batch=TINY["batch"], warmup=1,
                   repeat=2, bucket_cap_mb=0.025, gradient_as_bucket_view=True, profile_steps=2)
    b = res["bucket"]
    assert b["gradient_as_bucket_view"] and b["grad_diff"] <= res["tol"] and b["n_buckets"] > 1
    assert b["ddp_ms"] > 0 and b["comm_ms"] > 0
    assert "CUDA kernels" in b["profile"]["skipped"]          # gloo on CPU processes: nothing to profile


def test_pipeline_matches_the_unsplit_model():
    res = D.launch("pipeline", 2, "gloo", timeout_s=90, model=TINY["pipe_model"], batch=TINY["pipe_batch"],
                   micro_batches=[1, 4], warmup=1, repeat=1)
    assert [r["micro_batches"] for r in res["rows"]] == [1, 4]
    for row in res["rows"]:
        assert abs(row["loss"] - res["ref_loss"]) <= 1e-5 * abs(res["ref_loss"])
        assert all(0.0 <= st["bubble"] < 1.0 and st["grad_diff"] <= res["tol"] for st in row["stages"])
        assert row["bubble_formula"] == A.bubble_fraction(2, row["micro_batches"])


def test_suite_runs_every_part_in_one_launch_and_skips_a_missing_one():
    res = D.launch("suite", 2, "gloo", timeout_s=90,
                   ddp=dict(model=TINY["model"], batch=TINY["batch"], warmup=1, repeat=1, buckets_mb=[None],
                            accum_steps=2, accum_micro=1),
                   allreduce=dict(sizes=[4096], warmup=1, repeat=1), pipeline=None)
    assert res["pipeline"] is None and res["world_size"] == 2
    assert res["ddp"]["checks"]["DDP step"] <= res["ddp"]["tol"]
    assert [r["bytes"] for r in res["allreduce"]["rows"]] == [4096]
    assert res["ddp"]["work_s"] > 0 and res["allreduce"]["work_s"] > 0


def test_suite_runs_the_single_process_part_on_rank_0():
    res = D.launch("suite", 2, "gloo", timeout_s=90,
                   dp=dict(model=TINY["model"], batch=2, gpus=0, warmup=1, repeat=1),
                   ddp=dict(model=TINY["model"], batch=TINY["batch"], warmup=1, repeat=1, buckets_mb=[None],
                            accum_steps=2, accum_micro=1),
                   allreduce=dict(sizes=[4096], warmup=1, repeat=1))
    assert res["dp"]["checks"]["DDP, 1 process"] <= res["dp"]["tol"]      # DDP on a group of rank 0 alone
    assert "1 device, plain" in res["dp"]["timings"] and res["dp"]["work_s"] > 0
    assert res["ddp"]["checks"]["DDP step"] <= res["ddp"]["tol"] and res["pipeline"] is None


def test_single_process_dp_on_cpu():
    res = D.launch("dp", 1, "gloo", timeout_s=60, model=TINY["model"], batch=2, gpus=0, warmup=1, repeat=2)
    assert res["dp_device_ids"] == []                     # DataParallel wraps nothing on the CPU
    assert set(res["timings"]) == {"1 device, plain", "DDP, 1 process"}
    assert res["checks"]["DDP, 1 process"] <= res["tol"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_allreduce_on_two_gpus():
    res = D.launch("allreduce", 2, "nccl", timeout_s=120, sizes=[2**20, 2**26], warmup=2, repeat=5)
    assert [r["bytes"] for r in res["rows"]] == [2**20, 2**26]
    assert all(r["busbw_gbps"] == pytest.approx(r["algbw_gbps"]) for r in res["rows"])   # n = 2
    assert res["link"]["peer_access"] is not None


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_ddp_profile_on_two_gpus():
    res = D.launch("buckets", 2, "nccl", timeout_s=180, model=TINY["model"], batch=4, warmup=1, repeat=2,
                   bucket_cap_mb=0.025, gradient_as_bucket_view=False, profile_steps=2)
    prof = res["bucket"]["profile"]
    assert "error" not in prof, prof
    assert prof["DDP step"]["nccl_ms"] > 0 and prof["compute only"]["nccl_ms"] == 0
    assert 0 <= prof["DDP step"]["nccl_beside_compute_ms"] <= prof["DDP step"]["nccl_ms"]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_dp_and_ddp_on_two_gpus():
    res = D.launch("dp", 1, "nccl", timeout_s=120, model=TINY["model"], batch=4, gpus=2, warmup=1, repeat=2)
    assert res["dp_device_ids"] == [0, 1]
    assert all(d <= res["tol"] for d in res["checks"].values())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_suite_with_dataparallel_on_rank_0_over_nccl():
    # notebook 14's single launch: DataParallel over both GPUs from rank 0 while rank 1 waits
    res = D.launch("suite", 2, "nccl", timeout_s=180,
                   dp=dict(model=TINY["model"], batch=4, gpus=2, warmup=1, repeat=2),
                   ddp=dict(model=TINY["model"], batch=4, warmup=1, repeat=2, buckets_mb=[None],
                            accum_steps=2, accum_micro=2),
                   allreduce=dict(sizes=[2**20], warmup=1, repeat=2),
                   pipeline=dict(model=TINY["pipe_model"], batch=TINY["pipe_batch"], micro_batches=[1, 2],
                                 warmup=1, repeat=1))
    assert res["dp"]["dp_device_ids"] == [0, 1]
    assert all(d <= res["dp"]["tol"] for d in res["dp"]["checks"].values())
    assert res["ddp"]["checks"]["DDP step"] <= res["ddp"]["tol"] and len(res["pipeline"]["rows"]) == 2


def test_state_bytes_per_gpu_under_ddp_and_fsdp2():
    """fp32 AdamW: 16 bytes a parameter on every GPU under DDP (+ its gradient buckets across GPUs); 1/n of
    it under FSDP2, plus the unit being gathered (and, kept from forward to backward, every unit)."""
    p, unit = 1000, 100
    ddp = A.state_bytes_per_gpu(p, 2, "ddp", unit)
    assert ddp["total"] == 16 * p + 4 * p and A.state_bytes_per_gpu(p, 1, "ddp")["buckets"] == 0
    assert ddp["rest"] == 4 * p + 8 * p + 4 * p                       # weights, AdamW, buckets: no gradients
    fsdp = A.state_bytes_per_gpu(p, 4, "fsdp", unit)
    assert fsdp["total"] == 16 * p / 4 + 12 * unit and fsdp["buckets"] == 0   # two gathered units, one gradient
    assert fsdp["rest"] == 12 * p / 4
    keep = A.state_bytes_per_gpu(p, 4, "fsdp-keep", unit)
    assert keep["transient"] == 4 * p + 4 * unit > fsdp["transient"]
    ahead = A.state_bytes_per_gpu(p, 4, "fsdp", unit, prefetch=2)         # one more unit gathered ahead
    assert ahead["transient"] == fsdp["transient"] + 4 * unit and ahead["rest"] == fsdp["rest"]
    with pytest.raises(ValueError, match="prefetch"):
        A.state_bytes_per_gpu(p, 4, "fsdp", unit, prefetch=0)
    with pytest.raises(ValueError, match="strategy"):
        A.state_bytes_per_gpu(p, 2, "zero")
    with pytest.raises(ValueError, match="at least one GPU"):
        A.state_bytes_per_gpu(p, 0, "ddp")


def test_fsdp2_check_catches_a_rank_that_trains_on_other_data():
    """The FSDP2 experiment's check can fail: the last rank's batch doubled in the checked steps changes the
    first step's gradients (one process is enough to show it, and starts faster; notebook 14 runs two)."""
    with pytest.raises(D.LaunchError, match="Mismatch: FSDP2 over 1 processes, first step: gradients differ from DDP's"):
        D.launch("fsdp", 1, "gloo", timeout_s=90, model=TINY["model"], batch=TINY["batch"], warmup=1, repeat=1,
                 corrupt=True)
