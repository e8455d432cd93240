"""gpulab.lessons.l04_occupancy_and_waves: the per-SM limits table, the occupancy calculator (hand-computed cases on
several architectures), reading a compiled Triton kernel, and the no-Triton fallbacks."""
import inspect
from types import SimpleNamespace

import pytest
import torch

from gpulab.lessons import l04_occupancy_and_waves as occ_mod
from gpulab.lessons.l04_occupancy_and_waves import BLOCK_SIZES, NUM_WARPS, SM_LIMITS, KernelResources, Occupancy, bandwidth_experiment, device_limits_check, kernel_resources, occupancy, predicted_staircase, scale_kernel, sm_limits, triton_status, wave_kernel, wave_programs, waves
from gpulab.notebook.widgets import Choice, Panel

KiB = 1024


# -- the table -------------------------------------------------------------------------
def test_every_row_is_sourced_and_consistent():
    assert set(SM_LIMITS) == {(7, 0), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (12, 0)}
    for cc, lim in SM_LIMITS.items():
        assert lim.cc == cc and lim.source and lim.architecture and lim.example
        assert lim.max_warps * 32 in (1024, 1536, 2048)
        assert lim.registers == lim.registers_per_block == 65536
        assert lim.max_registers_per_thread == 255 and lim.register_unit == 256
        assert lim.shared_per_block <= lim.shared_per_sm
        # From Ampere on the driver reserves 1 KiB per block and allocates in 128-byte units.
        assert (lim.shared_reserved, lim.shared_unit) == ((1024, 128) if cc >= (8, 0) else (0, 256))


@pytest.mark.parametrize("cc, warps, blocks, smem_sm, smem_block", [
    ((7, 0), 64, 32, 96 * KiB, 96 * KiB),      # V100
    ((7, 5), 32, 16, 64 * KiB, 64 * KiB),      # T4: half the warps of Volta
    ((8, 0), 64, 32, 164 * KiB, 163 * KiB),    # A100
    ((8, 6), 48, 16, 100 * KiB, 99 * KiB),     # RTX 3090
    ((8, 9), 48, 24, 100 * KiB, 99 * KiB),     # RTX 4090
    ((9, 0), 64, 32, 228 * KiB, 227 * KiB),    # H100 / H200
    ((10, 0), 64, 32, 228 * KiB, 227 * KiB),   # B200
    ((12, 0), 48, 32, 100 * KiB, 99 * KiB),    # RTX 5090 (deviceQuery: 102400 B per SM, 101376 per block)
])
def test_table_values(cc, warps, blocks, smem_sm, smem_block):
    lim = SM_LIMITS[cc]
    assert (lim.max_warps, lim.max_blocks, lim.shared_per_sm, lim.shared_per_block) == \
        (warps, blocks, smem_sm, smem_block)


def test_a_newer_minor_version_borrows_its_major_and_says_so():
    lim = sm_limits((12, 1))
    assert lim.cc == (12, 1) and lim.max_warps == 48
    assert lim.source.startswith("assumed equal to 12.0")
    assert sm_limits((9, 0)) is SM_LIMITS[(9, 0)]


def test_an_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="no per-SM limits for compute capability 6.1"):
        sm_limits((6, 1))


# -- the calculator: hand-computed cases ----------------------------------------------------
# Worked by hand: warps/block = ceil(threads/32); registers per warp = roundup(regs*32, 256);
# warps the registers allow = 4 * floor(16384 / regs per warp); shared per block =
# roundup(shared + reserved, unit); blocks = min of every limit.
@pytest.mark.parametrize("cc, threads, regs, smem, blocks, warps, pct, limiter", [
    # A100: 256 threads x 32 registers: 8 blocks fill all 64 warps (registers allow exactly 8 too)
    ((8, 0), 256, 32, 0, 8, 64, 100.0, "warps"),
    # 64 registers: 2048 per warp, 8 warps per sub-partition, 32 warps = 4 blocks
    ((8, 0), 256, 64, 0, 4, 32, 50.0, "registers"),
    # 255 registers: 8160 -> 8192 per warp, 2 warps per sub-partition, 8 warps = 1 block
    ((8, 0), 256, 255, 0, 1, 8, 12.5, "registers"),
    # 33 registers: 1056 -> 1280 per warp (rounding), 12 per sub-partition, 48 warps = 6 blocks
    ((8, 0), 256, 33, 0, 6, 48, 75.0, "registers"),
    # RTX 3090: 48 KiB of shared memory: 49152 + 1024 reserved = 50176 B, 102400 // 50176 = 2 blocks
    ((8, 6), 256, 32, 48 * KiB, 2, 16, 100 * 16 / 48, "shared memory"),
    # T4 holds only 32 warps: 4 blocks of 256 threads are 100%
    ((7, 5), 256, 32, 0, 4, 32, 100.0, "warps"),
    ((7, 5), 1024, 32, 0, 1, 32, 100.0, "warps"),
    # RTX 4090: single-warp blocks hit the 24-block cap at half occupancy
    ((8, 9), 32, 16, 0, 24, 24, 50.0, "blocks"),
    # H100/H200: 128 threads x 16 registers: 16 blocks, every warp slot
    ((9, 0), 128, 16, 0, 16, 64, 100.0, "warps"),
    # one-warp blocks: the 32-block cap leaves half the warp slots empty
    ((9, 0), 32, 16, 0, 32, 32, 50.0, "blocks"),
    # 12 KiB shared per block: 12288 + 1024 = 13312 B, 233472 // 13312 = 17 (not 19: the reserved KiB counts)
    ((9, 0), 32, 8, 12 * KiB, 17, 17, 100 * 17 / 64, "shared memory"),
    # the most shared memory a block may use: one block per SM
    ((9, 0), 128, 16, 227 * KiB, 1, 4, 100 * 4 / 64, "shared memory"),
    # Volta has no reserved shared memory: 96 KiB is exactly one block
    ((7, 0), 256, 32, 96 * KiB, 1, 8, 12.5, "shared memory"),
    # RTX 5090: 48 warps like Ada, but 32 blocks
    ((12, 0), 32, 16, 0, 32, 32, 100 * 32 / 48, "blocks"),
])
def test_hand_computed_cases(cc, threads, regs, smem, blocks, warps, pct, limiter):
    o = occupancy(cc, threads, regs, smem)
    assert (o.active_blocks, o.active_warps, o.limiter) == (blocks, warps, limiter)
    assert o.percent == pytest.approx(pct)
    assert o.fraction == pytest.approx(pct / 100)
    assert o.limits[limiter] == blocks


def test_ties_name_every_limiting_resource():
    o = occupancy((8, 0), 256, 32)
    assert o.limited_by == ("warps", "registers")
    o = occupancy((8, 9), 64, 16)              # 24 blocks by warps and by the block cap
    assert o.limited_by == ("warps", "blocks") and o.percent == 100.0


def test_allocations_are_rounded_like_cuda():
    o = occupancy((9, 0), 96, 33, 100)          # 3 warps; 33*32 = 1056 -> 1280 per warp
    assert o.warps_per_block == 3
    assert o.registers_per_block == 3 * 1280
    assert o.shared_per_block == 1152           # 100 + 1024 reserved -> 1152 (128-byte units)
    assert occupancy((7, 5), 64, 0, 100).shared_per_block == 256   # 256-byte units, nothing reserved


def test_no_registers_and_no_shared_memory_impose_no_limit():
    o = occupancy((7, 5), 64, 0, 0)
    assert o.limits["registers"] is None and o.limits["shared memory"] is None
    assert o.active_blocks == 16 and o.limiter == "warps"   # 32 warps / 2 = 16 = the block cap too


def test_a_block_that_cannot_fit_gets_zero():
    # 1024 threads x 128 registers = 131072 registers > 65536 per block: the launch would fail
    o = occupancy((9, 0), 1024, 128)
    assert not o.fits and o.active_blocks == 0 and o.limiter == "registers" and o.percent == 0
    assert "does not fit" in str(o)
    # 1024 threads x 64 registers is exactly the register file: one block
    assert occupancy((9, 0), 1024, 64).active_blocks == 1


def test_str_reads_well():
    assert str(occupancy((9, 0), 1024, 64)) == ("cc 9.0, 1024 threads x 64 registers, 0 B shared: "
                                               "1 block per SM, 32/64 warps (50.0%), limited by registers")
    assert "8 blocks per SM, 64/64 warps (100.0%), limited by warps" in str(occupancy((8, 0), 256, 32))


@pytest.mark.parametrize("args, message", [
    (((9, 0), 0, 32, 0), "threads_per_block must be between 1 and 1024 (got 0)."),
    (((9, 0), 2048, 32, 0), "threads_per_block must be between 1 and 1024 (got 2048)."),
    (((9, 0), 256, 256, 0), "registers_per_thread must be between 0 and 255 (got 256)."),
    (((9, 0), 256, -1, 0), "registers_per_thread must be between 0 and 255 (got -1)."),
    (((8, 6), 256, 32, 100 * KiB), "shared_bytes_per_block must be between 0 and 101376 on compute "
                                   "capability 8.6 (got 102400)."),
    (((9, 0), 256.0, 32, 0), "threads_per_block must be a whole number (got 256.0)."),
    (((9, 0), 256, True, 0), "registers_per_thread must be a whole number (got True)."),
])
def test_impossible_inputs_are_refused(args, message):
    with pytest.raises(ValueError) as info:
        occupancy(*args)
    assert str(info.value) == message


# The lesson's scale_kernel as Triton 3.6 compiled it for sm_90a with a launch's specialization
# (16-byte-aligned pointers, n divisible by 16; compiled ahead of time, registers from the cubin):
# the occupancy notebook 04 predicts on an H200 before it measures.
@pytest.mark.parametrize("block_size, num_warps, regs, blocks, pct, limiter", [
    (128, 4, 10, 16, 100.0, "warps"),
    (1024, 4, 18, 16, 100.0, "warps"),
    (2048, 4, 26, 16, 100.0, "warps"),
    (4096, 4, 46, 10, 62.5, "registers"),       # 46*32 = 1472 -> 1536 per warp: 10 warps per quarter
    (8192, 4, 86, 5, 31.25, "registers"),
    (16384, 4, 168, 3, 18.75, "registers"),
    (4096, 1, 166, 12, 18.75, "registers"),
    (4096, 2, 85, 10, 31.25, "registers"),
    (4096, 32, 14, 2, 100.0, "warps"),
])
def test_h200_predictions_for_the_scale_kernel(block_size, num_warps, regs, blocks, pct, limiter):
    o = occupancy((9, 0), num_warps * 32, regs, 0)
    assert (o.active_blocks, o.percent, o.limiter) == (blocks, pct, limiter)


def test_the_wave_kernel_holds_one_block_per_h200_sm():
    # 1024 threads x 51 registers and 16 KiB of shared memory (Triton 3.6, sm_90a): one block
    o = occupancy((9, 0), occ_mod.WAVE_WARPS * 32, 51, 16384)
    assert o.active_blocks == 1 and o.limiter == "registers"


# -- a compiled Triton kernel, read --------------------------------------------------------
def fake_compiled(n_regs=22, loaded=True):
    md = SimpleNamespace(num_warps=4, shared=0, name="scale_kernel")
    k = SimpleNamespace(metadata=md, name="scale_kernel", n_spills=0)
    if loaded:
        k.n_regs = n_regs
    else:
        def init():  # Triton 3.x fills n_regs / n_spills when it loads the binary
            k.n_regs, k.n_spills = n_regs, 2
        k._init_handles = init
    return k


def test_kernel_resources_reads_triton_metadata():
    res = kernel_resources(fake_compiled())
    assert res == KernelResources("scale_kernel", 4, 22, 0, 0)
    assert res.threads_per_block == 128


def test_kernel_resources_loads_the_binary_when_needed():
    res = kernel_resources(fake_compiled(n_regs=40, loaded=False))
    assert (res.registers_per_thread, res.spills) == (40, 2)


def test_the_kernels_are_readable_source_on_any_machine():
    assert "tl.load" in inspect.getsource(scale_kernel)
    assert "acc * a + b" in inspect.getsource(wave_kernel)


# -- the latency bound -----------------------------------------------------------------
def test_latency_bound_takes_the_knee_at_its_own_rate():
    """Little's law at the knee (issue 40: it was called the latency the GPU 'really has', and divided by notebook
    00's copy ceiling rather than the knee's own rate, which is not a bound where the knee ran slower)."""
    runs = {(128, 4): {"GB/s": 300.0, "KiB in flight/SM": 8},
            (1024, 4): {"GB/s": 950.0, "KiB in flight/SM": 64},       # within 10 % of the best: the knee
            (4096, 4): {"GB/s": 1000.0, "KiB in flight/SM": 256}}
    got = occ_mod.latency_bound(runs, sm_count=10)
    assert got["knee"] == (1024, 4) and got["KiB in flight/SM"] == 64 and got["read GB/s"] == 475.0
    assert got["us"] == pytest.approx(64 * KiB * 10 / 475e9 * 1e6)           # 1.38 us: its rate, not the best's
    assert occ_mod.latency_bound(runs, sm_count=10, within=1.0)["knee"] == (4096, 4)
    for bad in (dict(runs={}, sm_count=10), dict(runs=runs, sm_count=0), dict(runs=runs, sm_count=10, within=0)):
        with pytest.raises(ValueError):
            occ_mod.latency_bound(**bad)


# -- waves -----------------------------------------------------------------------------
def test_waves_and_the_staircase():
    assert [waves(p, 132) for p in (1, 131, 132, 133, 264, 265, 396)] == [1, 1, 1, 2, 2, 3, 3]
    assert predicted_staircase([1, 132, 133, 396], 132, 0.1) == pytest.approx([0.1, 0.1, 0.2, 0.3])
    with pytest.raises(ValueError):
        waves(0, 132)


def test_wave_programs_straddle_every_multiple_of_the_sm_count():
    xs = wave_programs(132)
    assert xs == sorted(set(xs)) and xs[0] == 1 and xs[-1] == 397
    for k in (1, 2, 3):
        assert {132 * k - 1, 132 * k, 132 * k + 1} <= set(xs)
    assert 30 <= len(xs) <= 60
    assert wave_programs(2, waves_shown=2) == [1, 2, 3, 4, 5]


# -- without Triton -------------------------------------------------------------------------
def test_triton_status_on_the_cpu(on_cpu):
    ok, why = triton_status()
    assert not ok and "no CUDA GPU" in why


def test_bandwidth_experiment_refuses_without_a_gpu(on_cpu):
    with pytest.raises(ValueError, match="needs a CUDA GPU with Triton: no CUDA GPU"):
        bandwidth_experiment()
    with pytest.raises(ValueError, match="block_size must be one of"):
        bandwidth_experiment(block_size=100)
    with pytest.raises(ValueError, match="num_warps must be one of"):
        bandwidth_experiment(num_warps=3)


def test_scale_kernel_resources_refuse_without_a_gpu(on_cpu):
    with pytest.raises(ValueError, match="needs a CUDA GPU with Triton: no CUDA GPU"):
        occ_mod.scale_kernel_resources(1024, 4)
    with pytest.raises(ValueError, match="block_size must be one of"):
        occ_mod.scale_kernel_resources(100, 4)
    with pytest.raises(ValueError, match="num_warps must be one of"):
        occ_mod.scale_kernel_resources(1024, 3)


def test_the_panel_shows_the_refusal_on_the_cpu(on_cpu, capsys):
    panel = Panel(bandwidth_experiment, {"block_size": Choice(BLOCK_SIZES), "num_warps": Choice(NUM_WARPS)},
                  metric="GB/s")
    assert panel.history == []
    assert "needs a CUDA GPU with Triton" in capsys.readouterr().out


def test_device_limits_check_is_empty_on_the_cpu(on_cpu):
    assert device_limits_check() == []


# -- on a GPU -----------------------------------------------------------------------------
@pytest.mark.gpu
def test_the_table_matches_this_gpu():
    rows = device_limits_check()
    assert rows
    for quantity, ours, reported in rows:
        if reported is not None:
            assert ours == reported, f"{quantity}: gpulab's table says {ours}, the GPU says {reported}"


@pytest.mark.gpu
def test_the_triton_kernels_run_and_are_checked():
    ok, why = triton_status()
    if not ok:
        pytest.skip(why)
    r = bandwidth_experiment(1024, 4, n=2**22)
    assert r["GB/s"] > 0 and r["registers"] > 0 and 0 < r["occupancy %"] <= 100
    res = occ_mod.scale_kernel_resources(1024, 4)           # the same compiled kernel, read without timing it
    assert res.registers_per_thread == r["registers"] and res.num_warps == 4
    wave = occ_mod.WaveKernel(iters=4, waves_shown=1)
    assert isinstance(wave.occupancy, Occupancy) and wave.occupancy.active_blocks >= 1
    assert wave.slots == torch.cuda.get_device_properties(0).multi_processor_count * wave.occupancy.active_blocks
    assert wave.max_programs == wave.slots + 1
    assert wave.time(2, launches=2, repeat=3).median_ms > 0


def test_the_wave_kernel_refuses_without_a_gpu(on_cpu):
    with pytest.raises(ValueError, match="iters must be >= 2"):
        occ_mod.WaveKernel(iters=1)
    with pytest.raises(ValueError, match="needs a CUDA GPU with Triton"):
        occ_mod.WaveKernel(iters=512)
