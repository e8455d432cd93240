"""Notebook 04's calculator and kernels: SM occupancy computed, and waves measured.

- `SM_LIMITS`, `sm_limits(cc)`: what one SM can hold, per compute capability, each row sourced.
- `occupancy(cc, threads, registers, shared)`: theoretical occupancy of a kernel, computed the
  way CUDA's own occupancy calculator (`cuda_occupancy.h`) does it, with the resource that limits it.
- `kernel_resources(compiled)`: registers, spills, shared memory and warps of a compiled Triton kernel.
- `triton_status()`: whether this machine can run the lesson's Triton kernels, and if not, why.
- `scale_kernel`, `wave_kernel`: the lesson's two Triton kernels, written as plain functions and
  compiled with `triton.jit` on first use (Triton is imported only where a CUDA GPU is present).
- `scale_kernel_resources`: what `scale_kernel` compiled for this GPU uses (registers...) for one
  BLOCK_SIZE / num_warps, read at run time: the numbers notebook 04 predicts occupancy from.
- `bandwidth_experiment`: achieved GB/s of `scale_kernel` for one BLOCK_SIZE / num_warps; `latency_bound`:
  the upper bound a sweep of them puts on the memory's latency under load.
- `WaveKernel`, `waves`: fixed work per program; run time against the number of programs.
- `CONFIG`, `config(scale)`: the lesson's sizes, shared by the notebook and `gpulab bench`.
- `headline(scale)`: one program past a full wave against a full wave, what notebook 04's
  self-check and `gpulab bench` measure.

Occupancy = resident warps per SM / the most warps an SM can hold. A block is resident on one SM
until it finishes, and it holds its warps, registers and shared memory all that time, so each of
these caps how many blocks fit at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence
import torch
from gpulab.core.device import device_facts, pick_device, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import free_memory
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import MIN_CALLS, Timing, benchmark, summarize


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "occupancy and waves"
HEADLINE = "one program past a full wave / a full wave, ms"      # the metric bands.toml judges
CONFIG = {
    "tiny": dict(
        bandwidth_elements=2**20,       # floats per buffer of the scale_kernel bandwidth experiment (4 MiB)
        wave_iters=64,                  # fused multiply-adds per value in every wave_kernel program
    ),
    "full": dict(bandwidth_elements=2**28, wave_iters=512),     # 1 GiB buffers
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 04 asks of the GPU at `scale` (gpulab.core.predict): the scale kernel's bandwidth
    sweep over 1 GiB buffers, and the wave kernel's staircase, each a fixed number of launches."""
    cfg = config(scale)
    calls = MIN_CALLS       # benchmark()'s least; the rest of its budget is host time
    # bandwidth_experiment, once per (BLOCK_SIZE, num_warps) of the sweep and once for the panel's default
    # run: randn writes x (4 n bytes), the checked launch reads x and writes y (8 n), the check x * 2 (8 n)
    # and torch.equal (8 n), then `calls` timed launches (8 n each). bandwidth_elements() may lower n on a
    # GPU with little free memory; the config's n is the most it moves.
    configs = len(BLOCK_SIZES) + len(NUM_WARPS) - 1 + 1
    n = cfg["bandwidth_elements"]
    swept = configs * (4 + 8 + 8 + 8 + 8 * calls) * n
    # the wave staircase: a launch of p programs costs waves(p, slots) full waves. slots = 132: the H200's
    # 132 SMs x 1 program each (results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json: 50 % occupancy); a GPU with fewer
    # SMs runs smaller waves, so there this over-counts.
    slots = 132
    per_time = (2 + 10) * 5                        # WaveKernel.time: 2 warm-up + 10 timed calls of 5 launches
    staircase = sum(waves(p, slots) for p in wave_programs(slots)) * per_time
    check = (1 + 2) * per_time                     # the self-check (headline): a full wave, and one program more
    built = 2 * (1 + 4)                            # WaveKernel built twice: launches of 1 program and of 3 waves + 1
    wave_flops = (staircase + check + built) * slots * 2 * WAVE_BLOCK * cfg["wave_iters"]
    work = [
        Work("copy_bandwidth", swept, 0.8, f"scale_kernel bandwidth sweep, {configs} runs over {4 * n // 2**20} MiB buffers"),
        # a full wave of fused multiply-adds reaches the fp32 matmul ceiling (H200: 51 TFLOP/s both)
        Work("matmul_fp32", wave_flops, 1.0, f"wave_kernel staircase + self-check, iters={cfg['wave_iters']}"),
    ]
    # host_s: see host_source; tiny runs the same formulas, with the full run's host time (tiny runs on
    # the CPU, where nothing is predicted: its plan is only for completeness)
    return Plan(host_s=13.5, work=work,
                host_source="wall time of notebook 04 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv "
                            "(H200, torch 2.11, 2026-11-30) minus its GPU work at that run's ceilings")


WARP = 32


KiB = 1024


# Sources for the table below (checked November 2026):
# [G] NVIDIA CUDA C++ Programming Guide, appendix "Compute Capabilities", table of technical
#     specifications per compute capability (docs.nvidia.com/cuda/cuda-programming-guide/
#     05-appendices/compute-capabilities.html): resident warps and blocks per SM, 64 K 32-bit
#     registers per SM and per block, at most 255 registers per thread, shared memory per SM
#     and per block (the largest carve-out; a block above 48 KB must opt in).
# [O] cuda_occupancy.h as shipped with CUDA 12.6 (the header behind cudaOccupancy* functions):
#     registers are allocated per warp in units of 256 and split over 4 SM sub-partitions,
#     shared memory in units of 256 bytes (7.x) or 128 bytes (8.0 and later), and from Ampere
#     on the driver reserves shared memory per block (cudaDevAttrReservedSharedMemoryPerBlock,
#     1 KB: the Programming Guide's "1 KB ... reserved for system use").
# [B] NVIDIA Blackwell Tuning Guide (CUDA 13), "Occupancy": 64 warps (10.0) / 48 warps (12.0),
#     32 blocks per SM, 228 KB (10.0) shared memory per SM, 227 KB (10.0) / 99 KB (12.0) per block.
#     For 12.0 the guide's 128 KB is the unified L1/shared array; the driver reports
#     102400 bytes of shared memory per SM (deviceQuery on an RTX 5090), which is what limits blocks.
# Granularities for 10.0 and 12.0 are not in the 12.6 header; they are assumed equal to 9.0's.
SOURCE_G = "CUDA C++ Programming Guide, Compute Capabilities (technical specifications)"


SOURCE_O = "cuda_occupancy.h (CUDA 12.6)"


SOURCE_B = "Blackwell Tuning Guide (CUDA 13), Occupancy"


@dataclass(frozen=True)
class SMLimits:
    """What one SM of a compute capability can hold at once. Notebook 04."""

    cc: tuple[int, int]
    architecture: str
    example: str                     # a GPU with this compute capability
    max_warps: int                   # resident warps per SM
    max_blocks: int                  # resident blocks per SM
    shared_per_sm: int               # bytes, largest shared-memory carve-out
    shared_per_block: int            # bytes, most one block may use (opt-in above 48 KB)
    shared_unit: int                 # bytes: shared memory is allocated in these units
    shared_reserved: int             # bytes the driver reserves per block
    registers: int = 65536           # 32-bit registers per SM
    registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    register_unit: int = 256         # registers are allocated per warp in units of this many
    sub_partitions: int = 4          # register file split in 4: warps are allocated in 4s
    max_threads_per_block: int = 1024
    source: str = f"{SOURCE_G}; {SOURCE_O}"

    @property
    def name(self) -> str:
        return f"{self.cc[0]}.{self.cc[1]}"


def _row(cc, arch, example, warps, blocks, smem_sm_kib, smem_block_kib, unit, reserved, source=None):
    extra = {} if source is None else {"source": source}
    return SMLimits(cc, arch, example, warps, blocks, smem_sm_kib * KiB, smem_block_kib * KiB,
                    unit, reserved, **extra)


SM_LIMITS: dict[tuple[int, int], SMLimits] = {r.cc: r for r in (
    #     cc      architecture    example          warps blocks smem/SM smem/block unit reserved (KiB)
    _row((7, 0), "Volta", "V100", 64, 32, 96, 96, 256, 0),
    _row((7, 5), "Turing", "T4", 32, 16, 64, 64, 256, 0),
    _row((8, 0), "Ampere", "A100", 64, 32, 164, 163, 128, 1024),
    _row((8, 6), "Ampere", "RTX 3090, A10", 48, 16, 100, 99, 128, 1024),
    _row((8, 7), "Ampere", "Jetson AGX Orin", 48, 16, 164, 163, 128, 1024),
    _row((8, 9), "Ada Lovelace", "RTX 4090, L4, L40S", 48, 24, 100, 99, 128, 1024),
    _row((9, 0), "Hopper", "H100, H200", 64, 32, 228, 227, 128, 1024),
    _row((10, 0), "Blackwell", "B200", 64, 32, 228, 227, 128, 1024,
         source=f"{SOURCE_B}; {SOURCE_G}; granularities as 9.0"),
    _row((12, 0), "Blackwell", "RTX 5090", 48, 32, 100, 99, 128, 1024,
         source=f"{SOURCE_B}; 100 KB usable per SM as the driver reports it; granularities as 9.0"),
)}


def sm_limits(cc: tuple[int, int]) -> SMLimits:
    """The per-SM limits of compute capability `cc`. Notebook 04.

    A capability missing from the table (a newer minor version) borrows the row of its
    major version, and its `source` says so; an unknown major version is refused.
    """
    cc = (int(cc[0]), int(cc[1]))
    if cc in SM_LIMITS:
        return SM_LIMITS[cc]
    same_major = sorted(k for k in SM_LIMITS if k[0] == cc[0])
    if not same_major:
        known = ", ".join(r.name for r in SM_LIMITS.values())
        raise ValueError(f"no per-SM limits for compute capability {cc[0]}.{cc[1]} in gpulab's table "
                         f"(known: {known}).")
    base = SM_LIMITS[same_major[-1]]
    return replace(base, cc=cc, source=f"assumed equal to {base.name}: {base.source}")


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


RESOURCES = ("warps", "registers", "shared memory", "blocks")


@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one kernel launch configuration on one SM. Notebook 04."""

    cc: tuple[int, int]
    threads_per_block: int
    registers_per_thread: int
    shared_bytes_per_block: int
    warps_per_block: int
    active_blocks: int              # resident blocks per SM
    active_warps: int               # resident warps per SM
    max_warps: int
    limiter: str                    # the resource that caps active_blocks (first of limited_by)
    limited_by: tuple[str, ...]     # every resource that gives the same cap
    limits: dict[str, int | None] = field(default_factory=dict)  # blocks per SM each resource allows
    registers_per_block: int = 0    # as allocated (rounded up per warp)
    shared_per_block: int = 0       # as allocated (rounded up, with the driver's reserved part)

    @property
    def fraction(self) -> float:
        """Resident warps / the SM's maximum: 0 to 1."""
        return self.active_warps / self.max_warps

    @property
    def percent(self) -> float:
        return 100.0 * self.fraction

    @property
    def fits(self) -> bool:
        """False when not even one block fits on an SM: such a launch fails."""
        return self.active_blocks > 0

    def __str__(self) -> str:
        head = (f"cc {self.cc[0]}.{self.cc[1]}, {self.threads_per_block} threads x "
                f"{self.registers_per_thread} registers, {self.shared_bytes_per_block} B shared")
        if not self.fits:
            return f"{head}: does not fit on an SM ({self.limiter}); the launch would fail"
        blocks = f"{self.active_blocks} block{'s' if self.active_blocks != 1 else ''} per SM"
        return (f"{head}: {blocks}, {self.active_warps}/{self.max_warps} warps "
                f"({self.percent:.1f}%), limited by {self.limiter}")


def occupancy(cc: tuple[int, int], threads_per_block: int, registers_per_thread: int,
              shared_bytes_per_block: int = 0) -> Occupancy:
    """Theoretical occupancy: how many blocks of this kernel one SM holds at once. Notebook 04.

    Follows cuda_occupancy.h: warps per block = ceil(threads / 32); registers are allocated
    per warp, rounded up to 256, and each of the SM's 4 sub-partitions holds a quarter of the
    register file; shared memory per block is rounded up to the allocation unit after adding
    what the driver reserves. The largest shared-memory carve-out is assumed. Values no launch
    could have (more than 1024 threads, more than 255 registers, more shared memory than a
    block may use) are refused with ValueError; a kernel that fits no block at all gets 0.
    """
    lim = sm_limits(cc)
    for name, value in (("threads_per_block", threads_per_block),
                        ("registers_per_thread", registers_per_thread),
                        ("shared_bytes_per_block", shared_bytes_per_block)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a whole number (got {value!r}).")
    if not 1 <= threads_per_block <= lim.max_threads_per_block:
        raise ValueError(f"threads_per_block must be between 1 and {lim.max_threads_per_block} "
                         f"(got {threads_per_block}).")
    if not 0 <= registers_per_thread <= lim.max_registers_per_thread:
        raise ValueError(f"registers_per_thread must be between 0 and {lim.max_registers_per_thread} "
                         f"(got {registers_per_thread}).")
    if not 0 <= shared_bytes_per_block <= lim.shared_per_block:
        raise ValueError(f"shared_bytes_per_block must be between 0 and {lim.shared_per_block} "
                         f"on compute capability {lim.name} (got {shared_bytes_per_block}).")

    warps = -(-threads_per_block // WARP)
    by_warps = lim.max_warps // warps

    regs_per_warp = _round_up(registers_per_thread * WARP, lim.register_unit)
    if regs_per_warp == 0:
        by_regs = None
    elif regs_per_warp * _round_up(warps, lim.sub_partitions) > lim.registers_per_block:
        by_regs = 0                 # the hardware's per-block register check fails
    else:
        warps_per_partition = (lim.registers // lim.sub_partitions) // regs_per_warp
        by_regs = warps_per_partition * lim.sub_partitions // warps

    shared = _round_up(shared_bytes_per_block + lim.shared_reserved, lim.shared_unit)
    by_shared = lim.shared_per_sm // shared if shared else None

    limits = {"warps": by_warps, "registers": by_regs, "shared memory": by_shared,
              "blocks": lim.max_blocks}
    active = min(v for v in limits.values() if v is not None)
    limited_by = tuple(k for k in RESOURCES if limits[k] == active)
    return Occupancy(
        cc=lim.cc, threads_per_block=threads_per_block, registers_per_thread=registers_per_thread,
        shared_bytes_per_block=shared_bytes_per_block, warps_per_block=warps,
        active_blocks=active, active_warps=active * warps, max_warps=lim.max_warps,
        limiter=limited_by[0], limited_by=limited_by, limits=limits,
        registers_per_block=regs_per_warp * warps, shared_per_block=shared,
    )


def device_limits_check(device: torch.device | None = None) -> list[tuple[str, Any, Any]]:
    """(quantity, gpulab's table, what the GPU reports) for this GPU; [] on the CPU. Notebook 04."""
    device = device or pick_device()
    if device.type != "cuda":
        return []
    p = torch.cuda.get_device_properties(device)
    lim = sm_limits((p.major, p.minor))
    rows = [("threads per SM", lim.max_warps * WARP, getattr(p, "max_threads_per_multi_processor", None)),
            ("registers per SM", lim.registers, getattr(p, "regs_per_multiprocessor", None)),
            ("shared memory per SM (bytes)", lim.shared_per_sm,
             getattr(p, "shared_memory_per_multiprocessor", None)),
            ("shared memory per block, opt-in (bytes)", lim.shared_per_block,
             getattr(p, "shared_memory_per_block_optin", None)),
            ("warp size", WARP, getattr(p, "warp_size", None))]
    return rows


# -- Triton: what a compiled kernel uses ----------------------------------------
@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel asks of an SM. Notebook 04."""

    name: str
    num_warps: int
    registers_per_thread: int
    spills: int                 # registers spilled to local memory (slow): 0 is what you want
    shared_bytes: int

    @property
    def threads_per_block(self) -> int:
        return self.num_warps * WARP


def kernel_resources(compiled: Any) -> KernelResources:
    """Registers, spills, shared memory and warps of a compiled Triton kernel. Notebook 04.

    `compiled` is what launching a `@triton.jit` function returns in Triton 3.x (a
    CompiledKernel). Its `metadata` holds `num_warps` and `shared` (bytes); `n_regs` and
    `n_spills` are read from the binary when it is loaded onto the GPU (at the first launch).
    """
    md = compiled.metadata
    if getattr(compiled, "n_regs", None) is None and hasattr(compiled, "_init_handles"):
        # Triton 3.x has no public call for this: the first launch runs it; guarded by hasattr above
        compiled._init_handles()          # load the binary: fills n_regs and n_spills
    return KernelResources(name=str(getattr(compiled, "name", None) or getattr(md, "name", "?")),
                           num_warps=int(md.num_warps), registers_per_thread=int(compiled.n_regs),
                           spills=int(getattr(compiled, "n_spills", 0) or 0), shared_bytes=int(md.shared))


def triton_status(device: torch.device | None = None) -> tuple[bool, str]:
    """(True, version) where the lesson's Triton kernels can run; else (False, why not). Notebook 04."""
    device = device or pick_device()
    if device.type != "cuda":
        return False, "no CUDA GPU here (this is a CPU run), and Triton compiles kernels for GPUs"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 7:
        return False, f"this GPU has compute capability {major}.{minor}; Triton needs Volta (7.0) or newer"
    try:
        import triton
    except Exception as err:  # noqa: BLE001 - any import failure means: no Triton here
        return False, f"`import triton` failed ({type(err).__name__}: {err})"
    note = "" if major >= 8 else " (Triton officially supports 8.0 and newer: if a kernel fails to compile here, that is why)"
    return True, f"Triton {triton.__version__} on compute capability {major}.{minor}{note}"


# -- the lesson's kernels --------------------------------------------------------
# Plain functions, so the notebook can show them on any machine; `_jitted` compiles them with
# triton.jit on a GPU. `tl` is bound to triton.language at that moment (annotations are
# strings here, so nothing below runs without Triton).
tl: Any = None


triton: Any = None


def scale_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    """y = 2 x: each program reads BLOCK_SIZE floats and writes BLOCK_SIZE floats (like a copy)."""
    pid = tl.program_id(0)                                   # which block of the data is mine
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n                                       # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x * 2.0, mask=mask)


def wave_kernel(out_ptr, iters, a, b, BLOCK: tl.constexpr):
    """The same arithmetic in every program: BLOCK independent chains of `iters` fused multiply-adds."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    acc = offsets.to(tl.float32)
    for _ in range(iters):
        acc = acc * a + b                                    # a=1, b=0 leaves acc unchanged: checkable
    tl.store(out_ptr + offsets, acc)


_JITTED: dict[str, Any] = {}


def _jitted(name: str) -> Any:
    """The triton.jit version of one of the kernels above; ValueError where Triton cannot run."""
    ok, why = triton_status()
    if not ok:
        raise ValueError(f"this experiment needs a CUDA GPU with Triton: {why}.")
    if not _JITTED:
        global triton, tl
        import triton as _triton
        import triton.language as _tl
        triton, tl = _triton, _tl
        _JITTED["scale"] = _triton.jit(scale_kernel)
        _JITTED["wave"] = _triton.jit(wave_kernel)
    return _JITTED[name]


def _device_cc(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


BLOCK_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


NUM_WARPS = (1, 2, 4, 8, 16, 32)


def bandwidth_elements(scale: str | None = None) -> int:
    """Elements per buffer for the bandwidth experiment: `config(scale)["bandwidth_elements"]` (2**28
    floats, 1 GiB, at full size; 2**20 when tiny), fewer on a GPU with little free memory (x, y and a
    check copy must fit in a quarter of it)."""
    n = config(scale)["bandwidth_elements"]
    free = free_memory()
    while free is not None and n > 2**20 and 3 * 4 * n > free[0] // 4:
        n //= 2
    return n


def scale_kernel_resources(block_size: int, num_warps: int) -> KernelResources:
    """What `scale_kernel` compiled for this GPU uses at one BLOCK_SIZE and num_warps. Notebook 04.

    Compiles it by launching it once on a 4 MiB buffer: a launch gives Triton the specialization the
    bandwidth experiment's launches get too (16-byte-aligned pointers, a length divisible by 16), so
    this is the same compiled kernel, cached for them. ValueError where Triton cannot run."""
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))} (got {block_size!r}).")
    if num_warps not in NUM_WARPS:
        raise ValueError(f"num_warps must be one of {', '.join(map(str, NUM_WARPS))} (got {num_warps!r}).")
    kernel = _jitted("scale")
    n = 2**20
    x = torch.zeros(n, device=pick_device())
    y = torch.empty_like(x)
    compiled = kernel[(triton.cdiv(n, block_size),)](x, y, n, BLOCK_SIZE=block_size, num_warps=num_warps)
    return kernel_resources(compiled)


def scale_with(x: torch.Tensor, block_size: int = 1024, num_warps: int = 4) -> torch.Tensor:
    """y = 2 x through `scale_kernel` launched with `block_size` values and `num_warps` warps a program (a power of
    two each); on a machine where Triton cannot run, PyTorch's own `x * 2`. Notebook 04's graded exercise."""
    if block_size < 16 or block_size & (block_size - 1) or num_warps < 1 or num_warps & (num_warps - 1):
        raise ValueError(f"block_size (>= 16) and num_warps must be powers of two, got {block_size}, {num_warps}")
    if not triton_status(x.device)[0]:
        return x * 2.0
    kernel = _jitted("scale")
    y = torch.empty_like(x)
    kernel[(triton.cdiv(x.numel(), block_size),)](x, y, x.numel(), BLOCK_SIZE=block_size, num_warps=num_warps)
    return y


def bandwidth_experiment(block_size: int = 1024, num_warps: int = 4, n: int | None = None) -> dict:
    """Achieved GB/s of `scale_kernel` (read + write) for one BLOCK_SIZE and num_warps. Notebook 04.

    Checks y == 2x before timing; reports the compiled kernel's registers and its theoretical
    occupancy on this GPU, and the bytes of loads one SM can have requested at once.
    """
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))} (got {block_size!r}).")
    if num_warps not in NUM_WARPS:
        raise ValueError(f"num_warps must be one of {', '.join(map(str, NUM_WARPS))} (got {num_warps!r}).")
    kernel = _jitted("scale")
    device = pick_device()
    n = n or bandwidth_elements()
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    grid = (triton.cdiv(n, block_size),)

    def launch():
        return kernel[grid](x, y, n, BLOCK_SIZE=block_size, num_warps=num_warps)

    compiled = launch()
    if not torch.equal(y, x * 2):
        raise AssertionError(f"scale_kernel (BLOCK_SIZE={block_size}, num_warps={num_warps}) is wrong")
    res = kernel_resources(compiled)
    occ = occupancy(_device_cc(device), res.threads_per_block, res.registers_per_thread, res.shared_bytes)
    t = benchmark(launch)                   # x and y are freed when this function returns
    sms = device_facts(device).sm_count      # a MIG slice's under its profile (gpulab.core.device)
    resident = min(occ.active_blocks, -(-grid[0] // sms))
    return {"GB/s": t.per_second(2 * 4 * n) / 1e9, "ms": t, "occupancy %": occ.percent,
            "blocks/SM": occ.active_blocks, "limited by": occ.limiter,
            "registers": res.registers_per_thread, "spills": res.spills,
            "KiB in flight/SM": resident * block_size * 4 / KiB}


def latency_bound(runs: dict, sm_count: int, within: float = 0.9) -> dict:
    """The upper bound a bandwidth sweep puts on the memory's latency under load (Little's law). Notebook 04.

    `runs`: `bandwidth_experiment` results keyed by (BLOCK_SIZE, num_warps). The knee is the configuration
    with the least "KiB in flight/SM" among those within `within` of the best GB/s. A load's mean latency is
    the bytes in flight over the rate they arrive at; the column is the most that configuration can have in
    flight (every resident program's loads outstanding at once: fewer may be), and half of its traffic is
    reads. So in-flight x SMs / its read rate is the longest a load can have taken on average at that rate:
    a bound from above, not a measurement. Returns {"knee", "KiB in flight/SM", "read GB/s", "us"}."""
    if not runs or sm_count < 1 or not 0 < within <= 1:
        raise ValueError(f"need runs, sm_count >= 1 and 0 < within <= 1 (got {len(runs or {})} runs, {sm_count}, {within})")
    best = max(r["GB/s"] for r in runs.values())
    knee = min((k for k, r in runs.items() if r["GB/s"] >= within * best), key=lambda k: runs[k]["KiB in flight/SM"])
    kib, reads = runs[knee]["KiB in flight/SM"], runs[knee]["GB/s"] / 2
    return {"knee": knee, "KiB in flight/SM": kib, "read GB/s": reads, "us": kib * KiB * sm_count / (reads * 1e9) * 1e6}


# -- waves -----------------------------------------------------------------------
def waves(programs: int, slots: int) -> int:
    """How many rounds `programs` equal programs need on `slots` places that run at once. Notebook 04."""
    if programs < 1 or slots < 1:
        raise ValueError(f"programs and slots must be >= 1 (got {programs}, {slots}).")
    return -(-programs // slots)


WAVE_BLOCK, WAVE_WARPS = 32768, 32


class WaveKernel:
    """`wave_kernel` ready to launch with any number of programs, each doing the same work. Notebook 04.

    With BLOCK=32768 and 32 warps (1024 threads, 32 independent chains per thread) one program
    keeps every scheduler of an SM busy. The first launch (one program) compiles the kernel and
    reads its resources; from its occupancy follows the wave size `slots` = SMs x programs per SM,
    and the output buffer is sized for `waves_shown` waves plus one program, all checked once.
    """

    def __init__(self, iters: int, waves_shown: int = 3, block: int = WAVE_BLOCK, num_warps: int = WAVE_WARPS):
        if iters < 2:
            raise ValueError(f"iters must be >= 2 (got {iters}); Triton compiles iters=1 as a special case.")
        self.kernel = _jitted("wave")
        self.device = pick_device()
        self.iters, self.block, self.num_warps = iters, block, num_warps
        self.max_programs = 1
        self.out = torch.empty(block, device=self.device)
        compiled = self.launch(1)
        self.resources = kernel_resources(compiled)
        self.occupancy = occupancy(_device_cc(self.device), self.resources.threads_per_block,
                                   self.resources.registers_per_thread, self.resources.shared_bytes)
        if not self.occupancy.fits:
            raise ValueError(f"wave_kernel does not fit on an SM here: {self.occupancy}")
        self.sms = device_facts(self.device).sm_count
        self.slots = self.sms * self.occupancy.active_blocks
        self.max_programs = waves_shown * self.slots + 1
        self.out = torch.empty(self.max_programs * block, device=self.device)
        self.launch(self.max_programs)
        checked = min(self.out.numel(), 2**24)              # float32 holds whole numbers exactly up to 2**24
        expected = torch.arange(checked, device=self.device, dtype=torch.float32)
        if not torch.equal(self.out[:checked], expected):
            raise AssertionError("wave_kernel wrote something other than its input (a=1, b=0)")
        del expected

    def launch(self, programs: int) -> Any:
        if not 1 <= programs <= self.max_programs:
            raise ValueError(f"programs must be between 1 and {self.max_programs} (got {programs}).")
        return self.kernel[(programs,)](self.out, self.iters, 1.0, 0.0, BLOCK=self.block,
                                       num_warps=self.num_warps)

    def time(self, programs: int, launches: int = 5, repeat: int = 10) -> Timing:
        """Timing of one launch: `launches` back-to-back launches per timed call, so the host's
        launch cost (tens of microseconds in Python) hides behind the GPU's work."""
        t = benchmark(lambda: [self.launch(programs) for _ in range(launches)], warmup=2, repeat=repeat)
        scaled = [s / launches for s in t.samples_ms]
        return summarize(scaled, t.device, t.method + f", {launches} launches per call")

    @property
    def flops_per_program(self) -> int:
        """2 FLOPs (multiply and add) per element per iteration."""
        return 2 * self.block * self.iters


def wave_programs(sms: int, waves_shown: int = 3, points: int = 33) -> list[int]:
    """Program counts for the staircase: an even spread up to waves_shown x sms, plus both sides
    of every multiple of the SM count. Notebook 04."""
    top = waves_shown * sms
    step = max(1, top // points)
    xs = set(range(step, top + 1, step)) | {1}
    for k in range(1, waves_shown + 1):
        xs |= {k * sms - 1, k * sms, k * sms + 1}
    return sorted(x for x in xs if 1 <= x <= top + 1)


def predicted_staircase(programs: Sequence[int], slots: int, one_wave_ms: float) -> list[float]:
    """Time if each wave costs what one full wave costs: waves(programs, slots) x one_wave_ms."""
    return [waves(p, slots) * one_wave_ms for p in programs]


def headline(scale: str | None = None) -> Measured:
    """One program more than a full wave costs a second wave (`WaveKernel` with `config(scale)["wave_iters"]`)."""
    ok, why = triton_status()
    if not ok:
        raise Skipped(why)
    wave = WaveKernel(iters=config(scale)["wave_iters"])     # compiles, then checks its output
    one, more = wave.time(wave.slots), wave.time(wave.slots + 1)
    return Measured(one.median_ms, more.median_ms, "ms", more.median_ms / one.median_ms, True,
                    "wave_kernel's output checked (a=1, b=0 leaves its input unchanged)",
                    f"{wave.slots} programs (one full wave)", f"{wave.slots + 1} programs")
