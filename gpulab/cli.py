"""The `gpulab` command. `gpulab doctor`: is this machine ready for the course?

Exit status 0 when everything the course needs is there, 1 otherwise; each
problem comes with a concrete fix. `--cpu-ok` accepts a machine without a GPU
(the course then runs at tiny size and its numbers are only illustrative).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _widget_extension() -> Path | None:
    """Where JupyterLab would load the ipywidgets front end from, if installed."""
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:
        return None
    for base in jupyter_path("labextensions"):
        pkg = Path(base) / "@jupyter-widgets" / "jupyterlab-manager" / "package.json"
        if pkg.is_file():
            return pkg.parent
    return None


def doctor_findings(cpu_ok: bool = False) -> list[Finding]:
    """Every check `gpulab doctor` makes, in order."""
    gpu_fail = WARN if cpu_ok else FAIL
    found: list[Finding] = []
    add = lambda *a: found.append(Finding(*a))  # noqa: E731

    v = sys.version_info
    add("python", OK if v >= (3, 10) else FAIL, sys.version.split()[0],
        "" if v >= (3, 10) else "use Python 3.10 or newer")

    try:
        import torch
    except ImportError as err:
        add("torch", FAIL, f"not importable ({err})", "run the README's set-up command")
        return found

    cuda_build = torch.version.cuda is not None
    add("torch", OK, f"{torch.__version__} ({'CUDA ' + torch.version.cuda if cuda_build else 'CPU build'})")

    from gpulab.monitor import nvml_status
    nvml_ok, nvml_why = nvml_status()

    gpu = torch.cuda.is_available()
    if gpu:
        p = torch.cuda.get_device_properties(0)
        add("GPU", OK, f"{torch.cuda.device_count()} visible; using {p.name} "
                       f"(compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs)")
    elif not cuda_build and nvml_ok:
        add("GPU", FAIL, "this machine has an NVIDIA GPU but PyTorch is a CPU build",
            "install a CUDA build: `pip install --force-reinstall torch` on Linux "
            "(see pytorch.org/get-started for the command for your CUDA version)")
    elif not cuda_build:
        add("GPU", gpu_fail, "no CUDA GPU: PyTorch is a CPU build and no NVIDIA driver answers",
            "run the course on a machine with an NVIDIA GPU; here it runs at tiny size "
            "and its numbers are only illustrative (`gpulab doctor --cpu-ok` accepts that)")
    else:
        add("GPU", gpu_fail, "PyTorch is a CUDA build but sees no GPU",
            "check `nvidia-smi`; check CUDA_VISIBLE_DEVICES; the driver must be at least as "
            f"new as CUDA {torch.version.cuda} needs")

    add("NVIDIA driver / NVML", OK if nvml_ok else gpu_fail, nvml_why,
        "" if nvml_ok else "the GPU monitor (lessons 00, 03, 05) needs NVML: install the NVIDIA "
        "driver, or start the container with the 'utility' driver capability "
        "(NVIDIA_DRIVER_CAPABILITIES=compute,utility); `pip install nvidia-ml-py`")
    if _version("pynvml"):
        add("pynvml package", WARN, f"the deprecated `pynvml` distribution {_version('pynvml')} "
            "is installed; it is a shim that warns on import",
            "pip uninstall pynvml  (gpulab needs only nvidia-ml-py)")

    try:
        triton = importlib.import_module("triton")
        t_status, t_detail, t_fix = OK, f"triton {triton.__version__}", ""
        if gpu and torch.cuda.get_device_capability(0) < (8, 0):
            t_status, t_fix = WARN, ("Triton officially supports compute capability 8.0+; "
                                     "lessons 04 and 12 say what they skip")
    except ImportError:
        t_status = gpu_fail if gpu or cuda_build else WARN
        t_detail = "not installed (torch.compile's GPU backend and lesson 04's kernels need it)"
        t_fix = "it comes with CUDA builds of torch on Linux: reinstall torch from PyPI"
    add("Triton", t_status, t_detail, t_fix)

    if gpu:
        free, total = torch.cuda.mem_get_info(0)
        gib = 2**30
        add("free GPU memory", OK if free >= 4 * gib else WARN,
            f"{free / gib:.1f} of {total / gib:.1f} GiB free",
            "" if free >= 4 * gib else "other processes hold GPU memory: lessons shrink to fit, "
            "but close them if you can (`nvidia-smi` lists them)")

    for dist, why in (("jupyterlab", "the course runs in JupyterLab"),
                      ("ipywidgets", "the lessons' panels"),
                      ("matplotlib", "every plot"), ("nvidia-ml-py", "the GPU monitor")):
        ver = _version(dist)
        add(dist, OK if ver else FAIL, ver or f"missing ({why})",
            "" if ver else f"pip install {dist}  (or re-run the README's set-up command)")

    ext = _widget_extension()
    add("JupyterLab widget extension", OK if ext else FAIL,
        f"found at {ext}" if ext else "@jupyter-widgets/jupyterlab-manager is not installed: "
        "panels would show 'Loading widget...' or a missing-extension message",
        "" if ext else "pip install --force-reinstall jupyterlab_widgets, then restart JupyterLab")

    from gpulab.device import SCALES, SettingError, _setting, pick_device, scale
    try:
        add("GPULAB_DEVICE", OK, f"lessons run on {pick_device()}")
        device_ok = True
    except SettingError as err:
        add("GPULAB_DEVICE", FAIL, str(err), "unset GPULAB_DEVICE, or set auto, cuda or cpu")
        device_ok = False
    try:
        _setting("GPULAB_SCALE", SCALES, "auto")
        add("GPULAB_SCALE", OK, f"lessons run at scale={scale()}" if device_ok
            else "valid (its 'auto' depends on the device setting above)")
    except SettingError as err:
        add("GPULAB_SCALE", FAIL, str(err), "unset GPULAB_SCALE, or set tiny, full or auto")
    return found


def doctor(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpulab doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-ok", action="store_true",
                        help="accept a machine without a GPU (tiny, illustrative runs)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    found = doctor_findings(cpu_ok=args.cpu_ok)
    failed = [f for f in found if f.status == FAIL]
    if args.json:
        print(json.dumps([asdict(f) for f in found], indent=1))
    else:
        width = max(len(f.check) for f in found)
        for f in found:
            print(f"{f.status:>4}  {f.check:<{width}}  {f.detail}")
            if f.fix and f.status != OK:
                print(f"{'':>4}  {'':<{width}}  fix: {f.fix}")
        print()
        print(f"NOT READY: {len(failed)} problem(s) above." if failed
              else "Ready for the course." + (" (GPU side: not checked, --cpu-ok)"
                                              if args.cpu_ok and not _has_gpu() else ""))
    return 1 if failed else 0


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"doctor": doctor}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: gpulab doctor [--cpu-ok] [--json]\n\n"
              "  doctor   check that this machine is ready for the course")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
