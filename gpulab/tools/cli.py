"""The `gpulab` command. `gpulab doctor`: is this machine ready for the course?

Exit status 0 when everything the course needs is there, 1 otherwise; each
problem comes with a concrete fix. `--cpu-ok` accepts a machine without a GPU
(the course then runs at tiny size and its numbers are only illustrative).

For instructors and maintainers (see docs/instructors.md):
`gpulab bench` runs each lesson's headline comparison headless against its band
(gpulab.tools.bench); `gpulab room FOLDER` merges a room's results files (gpulab.tools.room);
`gpulab report` prints or rewrites the "measured on" block of docs/results.md.
For learners after the course: `gpulab diagnose SCRIPT` profiles their own training step
(gpulab.diagnose, notebook 15).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import os
import shutil
import sys
import warnings
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

    from gpulab.core import monitor
    nvml_ok, nvml_why = monitor.nvml_status()
    try:
        monitor.import_pynvml()
        pynvml_module = True
    except ImportError:
        pynvml_module = False

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

    # Only a missing pynvml module is fixed by pip; with the module there (the nvidia-ml-py row
    # says ok), what is missing is the driver's library, which pip cannot install.
    nvml_fix = ("" if nvml_ok else
                "the GPU monitor (lessons 00, 03, 05) needs NVML: `pip install nvidia-ml-py`" if not pynvml_module
                else "the GPU monitor (lessons 00, 03, 05) needs NVML: install the NVIDIA driver, or start the "
                "container with the 'utility' driver capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility)")
    add("NVIDIA driver / NVML", OK if nvml_ok else gpu_fail, nvml_why, nvml_fix)
    shared = monitor.gpu_sharing(torch.device("cuda", 0)) if gpu else None
    if gpu:
        if shared is None:
            add("GPU shared?", WARN, "NVML cannot tell whether other processes use this GPU",
                "the course's numbers assume it has the GPU to itself")
        else:
            add("GPU shared?", WARN if shared.shared else OK, shared.note,
                "measurements on a shared GPU are marked 'shared' in the results store; for numbers that "
                "compare, run when the GPU is free (or on the whole GPU, not a MIG slice)" if shared.shared else "")
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
        t_detail = "not installed (torch.compile's GPU backend and lesson 04's kernels need it)"
        if gpu or cuda_build:
            t_status, t_fix = gpu_fail, "it comes with CUDA builds of torch on Linux: reinstall torch from PyPI"
        elif nvml_ok:                   # a GPU, but CPU torch: the GPU row's fix brings Triton with it
            t_status, t_fix = WARN, "it comes with the CUDA build of torch the GPU row asks for"
        else:                           # no GPU: the README installs the CPU build, without Triton, on purpose
            t_status, t_fix = OK, ""
            t_detail = ("not installed: only needed on a GPU (torch.compile's GPU backend, lesson 04's "
                        "kernels); not a problem on this machine")
    add("Triton", t_status, t_detail, t_fix)

    # torch.compile on a GPU: Triton builds a small C launcher per kernel, so a C compiler must be on PATH
    # (the CUDA runtime images have none)
    cc = next((shutil.which(c) for c in (os.environ.get("CC", ""), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    add("C compiler", OK if cc else (WARN if gpu else OK),
        f"{cc}" if cc else "none on PATH: torch.compile cannot build Triton's kernel launchers"
        + ("" if gpu else " (only needed on a GPU)"),
        "" if cc or not gpu else "install one (Debian/Ubuntu: apt-get install build-essential), or set CC")

    if gpu:
        if shared is not None and shared.mig:      # monitor.gpu_sharing's reading: the device name, NVML's MIG mode
            add("MIG slice", OK, f"{torch.cuda.get_device_name(0)}: this process sees one MIG slice (its SMs, "
                                 "memory and L2; no P2P, NVML reports no utilization for it)")
        counters = _profiler_records_kernels()
        add("profiler (CUPTI)", OK if counters is True else WARN,
            "torch.profiler records this GPU's kernels" if counters is True else f"kernels not recorded: {counters}",
            "" if counters is True else "in a container the GPU's profiling may be refused (ERR_NVGPUCTRPERM): "
            "lessons 01, 13 and gpulab diagnose need kernel traces; ask the admin to allow profiling "
            "(NVreg_RestrictProfilingToAdminUsers=0) or run with CAP_SYS_ADMIN")
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

    from gpulab.core.device import SCALES, SettingError, pick_device, scale, setting
    try:
        add("GPULAB_DEVICE", OK, f"lessons run on {pick_device()}")
        device_ok = True
    except SettingError as err:
        wanted = os.environ.get("GPULAB_DEVICE", "").strip().lower()
        add("GPULAB_DEVICE", FAIL, str(err),
            "unset GPULAB_DEVICE (or set cpu): PyTorch sees no CUDA GPU here" if wanted == "cuda"
            else "unset GPULAB_DEVICE, or set auto, cuda or cpu")
        device_ok = False
    try:
        setting("GPULAB_SCALE", SCALES, "auto")
        add("GPULAB_SCALE", OK, f"lessons run at scale={scale()}" if device_ok
            else "valid (its 'auto' depends on the device setting above)")
    except SettingError as err:
        add("GPULAB_SCALE", FAIL, str(err), "unset GPULAB_SCALE, or set tiny, full or auto")
    from gpulab.core.device import profile
    from gpulab.core.profiles import PROFILES
    try:
        prof = profile()
        if prof is None:
            add("GPULAB_PROFILE", OK, "unset: this GPU as it is")
        else:
            major, minor = prof.compute_capability
            from gpulab.core.device import SM_LIMIT
            sms = ""
            if prof.sm_count:
                sms = (f"; its {prof.sm_count} SMs: " + (SM_LIMIT["why"] if SM_LIMIT.get("sms") else
                       f"not applied ({SM_LIMIT['why']}), this GPU's SMs run the work" if gpu else
                       "on the CPU, its control flow only"))
            add("GPULAB_PROFILE", OK, f"emulating {prof.key}, {prof.name} (compute capability {major}.{minor}, "
                                      f"{prof.memory_gib:g} GiB): its code paths and memory; timings stay this machine's"
                                      + sms)
    except SettingError as err:
        add("GPULAB_PROFILE", FAIL, str(err),
            f"unset GPULAB_PROFILE (this GPU as it is), or set one of {', '.join(PROFILES)}")
    return found


def _profiler_records_kernels():
    """True if torch.profiler records a kernel on this GPU; else why not (text)."""
    import torch
    try:
        from gpulab.core.timing import gpu_kernels, gpu_profile
        x = torch.ones(1024, device="cuda")
        with gpu_profile() as prof:
            (x * 2).sum().item()
        return True if gpu_kernels(prof) else "the profile holds no GPU events"
    except Exception as err:      # noqa: BLE001 - a refusal shows up in many forms
        return f"{type(err).__name__}: {str(err)[:160]}"


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


def bench(argv: list[str] | None = None) -> int:
    """`gpulab bench`: exit 0, or 1 with --check when a row fails; 2 for bad arguments, bands or settings
    (GPULAB_DEVICE, GPULAB_SCALE, GPULAB_PROFILE) or a JSON path that cannot be written, each as one line on stderr.
    A results store that cannot be written is one line on stderr too; the bench still reports."""
    from gpulab.core.bands import load_bands
    from gpulab.core.device import SCALES
    from gpulab.tools import bench as B

    parser = argparse.ArgumentParser(
        prog="gpulab bench", description="Run each lesson's headline comparison and check it against its band.")
    parser.add_argument("--scale", choices=SCALES, default=None,
                        help="problem sizes (default: GPULAB_SCALE, else auto: full on a GPU, tiny on the CPU)")
    parser.add_argument("--lessons", default="", help="comma-separated lessons, e.g. 03,05 (default: all)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="where to write the JSON (default: beside the results store, under bench/)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a ratio falls outside its band or a result is wrong")
    parser.add_argument("--bands", metavar="PATH", default=None, help="bands file (default: gpulab/bands.toml)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--no-suite", action="store_true",
                        help="leave out lesson 15, gpulab.diagnose's suite of labelled bad/fixed steps")
    args = parser.parse_args(argv)
    from gpulab.core.device import pick_device, profile, resolve_scale
    from gpulab.core.results import UnusableResultsWarning, default_path, results_store
    try:
        experiments = B.select(args.lessons.split(",") if args.lessons else None)
        bands = load_bands(args.bands)
        pick_device()                  # GPULAB_DEVICE: a bad value, or cuda without a GPU
        resolve_scale(args.scale)      # GPULAB_SCALE, unless --scale overrides it
        profile()                      # GPULAB_PROFILE: a profile gpulab does not know
        if args.json:
            _check_writable(args.json, "the JSON")
        elif why := _folder_problem(default_path().parent / "bench"):
            raise ValueError(f"cannot write the JSON beside the results store, in {default_path().parent / 'bench'} "
                             f"({why}); give another place with --json PATH")
    except ValueError as err:          # SettingError and BandsError are ValueErrors
        print(f"gpulab bench: {err}", file=sys.stderr)
        return 2
    lessons = args.lessons.split(",") if args.lessons else None
    report = B.run(experiments, bands, progress=not args.no_progress, scale=args.scale)
    print(B.format_table(report))
    if B.wants_suite(lessons) and not args.no_suite:
        B.run_suite(report, args.scale, progress=not args.no_progress)
        print(B.format_suite(report.suite))
    target = args.json or B.default_json_path(report)
    try:
        path = B.write_json(report, target)
    except OSError as err:
        print(f"gpulab bench: cannot write the JSON to {target} ({err.strerror or err}); "
              "give another place with --json PATH", file=sys.stderr)
        return 2
    store = results_store()
    with warnings.catch_warnings():    # an unusable store is said once below, as one line
        warnings.simplefilter("ignore", UnusableResultsWarning)
        recorded = B.record(report, store) + B.record_suite(report, store)
    print(f"\nJSON: {path}")
    if store.problem:
        print(f"gpulab bench: nothing recorded in the results store {store.path}: {store.problem}; "
              "set GPULAB_RESULTS to a file in a folder you can write", file=sys.stderr)
    else:
        print(f"results store: {recorded} row(s) recorded in {store.path}")
    return 1 if args.check and (report.failed or report.suite_failed) else 0


def _folder_problem(folder: Path) -> str | None:
    """Why files cannot be made in `folder` (made first where missing), or None: the nearest
    folder at or above it that exists is a file, or is not writable."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK):
        return f"{folder} is not writable"
    return None


def _check_writable(path: str | os.PathLike, what: str) -> None:
    """ValueError("cannot write <what> to <path> (<why>)") if `path` clearly cannot be written: it
    is a folder, or the nearest folder above it that exists is a file or is not writable (missing
    folders in between are left to the caller: `gpulab bench` makes them, `gpulab room` refuses)."""
    path = Path(path)
    why = "it is a folder" if path.is_dir() else _folder_problem(path.parent)
    if why:
        raise ValueError(f"cannot write {what} to {path} ({why})")


def room(argv: list[str] | None = None) -> int:
    """`gpulab room FOLDER`: exit 0 (bad files are reported, not fatal); 2 if FOLDER is not a folder
    or --png / --json cannot be written there (one line on stderr)."""
    from gpulab.tools import room as R

    parser = argparse.ArgumentParser(
        prog="gpulab room", description="Merge a folder of results stores and bench JSON files into one comparison.")
    parser.add_argument("folder", help="folder with learners' results files and `gpulab bench` JSON files")
    parser.add_argument("--png", metavar="PATH", default=None, help="save the grouped bar chart as a PNG")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the merged table as JSON")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--learners", action="store_true",
                        help="one row per learner's results file (GPU, lessons run, marks: slice/shared, profile)")
    parser.add_argument("--board", action="store_true",
                        help="the graded exercises: each learner's newest verdict, ratio and target (verified, suspicious)")
    parser.add_argument("--watch", metavar="SECONDS", type=float, default=None,
                        help="print the table again every SECONDS as learners' results arrive (Ctrl-C stops)")
    parser.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)   # --watch's rounds (tests)
    args = parser.parse_args(argv)
    if args.watch is not None and args.watch <= 0:
        print("gpulab room: --watch needs a positive number of seconds", file=sys.stderr)
        return 2
    if args.learners or args.board or args.watch is not None:
        return _room_live(args, R)
    try:
        for flag, what in ((args.png, "the PNG"), (args.json, "the JSON")):
            if flag:
                _check_writable(flag, what)
                if not Path(flag).parent.is_dir():      # savefig and write_text make no folders
                    raise ValueError(f"cannot write {what} to {flag} (no folder {Path(flag).parent})")
        merged = R.merge(args.folder)
    except (FileNotFoundError, ValueError) as err:
        print(f"gpulab room: {err}", file=sys.stderr)
        return 2
    print(R.format_table(merged, markdown=args.markdown))
    try:
        if args.png:
            what, where = "the PNG", args.png
            R.room_plot(merged).savefig(args.png, dpi=120)
            print(f"plot: {args.png}")
        if args.json:
            what, where = "the JSON", args.json
            Path(args.json).write_text(json.dumps(merged.to_json(), indent=1) + "\n", encoding="utf-8")
            print(f"JSON: {args.json}")
    except OSError as err:
        print(f"gpulab room: cannot write {what} to {where} ({err.strerror or err})", file=sys.stderr)
        return 2
    return 0


def _room_live(args, R) -> int:
    """--learners and/or --watch: the table (per learner, or per lesson) printed once, or every --watch
    seconds; a file half-written at one look is read again at the next."""
    try:
        return _room_rounds(args, R)
    except KeyboardInterrupt:                  # Ctrl-C ends the watch wherever it lands
        return 0


def _room_rounds(args, R) -> int:
    import time
    done = 0
    while True:
        try:
            if args.learners or args.board:
                parts = [R.format_learners(R.learners(args.folder), markdown=args.markdown)] if args.learners else []
                if args.board:
                    parts.append(R.format_board(R.exercise_board(args.folder), markdown=args.markdown))
                text = "\n\n".join(parts)
            else:
                text = R.format_table(R.merge(args.folder), markdown=args.markdown)
        except (FileNotFoundError, ValueError) as err:
            print(f"gpulab room: {err}", file=sys.stderr)
            return 2
        if args.watch is not None:
            print(f"-- {time.strftime('%H:%M:%S')} {args.folder}")
        print(text, flush=True)
        done += 1
        if args.watch is None or (args.rounds is not None and done >= args.rounds):
            return 0
        time.sleep(args.watch)


def report(argv: list[str] | None = None) -> int:
    """`gpulab report`: print the "measured on" block (docs/results.md), or rewrite it in a file with --readme."""
    from gpulab.tools import room as R

    parser = argparse.ArgumentParser(
        prog="gpulab report", description="The 'measured on' block of docs/results.md, from the committed results files.")
    parser.add_argument("--results", default="results", help="folder of committed results files (default: results)")
    parser.add_argument("--readme", metavar="PATH", default=None,
                        help="rewrite the block between the measured-on markers in this file")
    args = parser.parse_args(argv)
    try:
        if args.readme:
            changed = R.update_readme(args.readme, args.results)
            print(f"{args.readme}: {'measured-on block rewritten' if changed else 'already up to date'}")
        else:
            print(R.measured_on_block(args.results))
    except ValueError as err:
        print(f"gpulab report: {err}", file=sys.stderr)
        return 2
    except OSError as err:             # a missing, unreadable or unwritable README or folder
        where = err.filename or args.readme or args.results
        print(f"gpulab report: {where}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0


STEP_NAMES = ("make_step", "step")


class ScriptError(ValueError):
    """The script given to `gpulab diagnose` cannot give a step: missing, a folder, a notebook, or its code
    fails while loading (a syntax error, a failing import, `make_step()` raising). One line, naming the
    user's file and line where there is one."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error_text(err: BaseException) -> str:
    """`ValueError: bad width`, on one line (the type alone when the error has no message)."""
    said = _one_line(str(err))
    return f"{type(err).__name__}: {said}" if said else type(err).__name__


def _same_file(a: str, b: str | os.PathLike) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def user_frame(tb, script: str | os.PathLike) -> str | None:
    """Where in the user's code a traceback went last: "train.py:20 in make_step" (the innermost frame in
    `script`; its module level is "train.py:20"), else the innermost frame in a file beside the script
    (a helper module of theirs), else None. Files are named as the user gave the script's path."""
    import traceback
    script = Path(script)
    folder = os.path.realpath(script.parent)
    frames = [(f.f_code.co_filename, line, f.f_code.co_name) for f, line in traceback.walk_tb(tb)]
    for in_script in (True, False):
        for filename, line, name in reversed(frames):
            if in_script and _same_file(filename, script):
                shown = str(script)
            elif not in_script and os.path.dirname(os.path.realpath(filename)) == folder:
                shown = str(script.parent / Path(filename).name)
            else:
                continue
            return f"{shown}:{line}" + ("" if name == "<module>" else f" in {name}")
    return None


def _load_error(err: BaseException, script: Path, during: str) -> ScriptError:
    """The one line for a script whose code failed `during` loading ("" at its module level, else
    "make_step()"): SyntaxError at its own file and line, anything else at the user's innermost frame."""
    if isinstance(err, SyntaxError) and err.filename and err.lineno and os.path.isfile(err.filename):
        shown = str(script) if _same_file(err.filename, script) else err.filename
        return ScriptError(f"{shown}:{err.lineno}: {type(err).__name__}: {_one_line(err.msg)}")
    where = user_frame(err.__traceback__, script) or (f"{script}: in {during}" if during else str(script))
    if isinstance(err, SystemExit):     # sys.exit() or argparse at module level: say where, not just quit
        return ScriptError(f"{where}: the script called sys.exit({err.code!r}) while loading; move its "
                           "command-line handling under `if __name__ == \"__main__\":`")
    return ScriptError(f"{where}: {_error_text(err)}")


def check_script(script: str | os.PathLike) -> Path:
    """The script's path, or ScriptError: it is missing, a folder, or a notebook."""
    path = Path(script)
    if path.is_dir():
        raise ScriptError(f"{os.fspath(script)} is a folder, not a script: give a Python file that defines make_step()")
    if not path.is_file():
        raise ScriptError(f"no script {path}")
    if path.suffix == ".ipynb":
        raise ScriptError(f"{path} is a notebook, not a script: `jupyter nbconvert --to script {path}` makes one; "
                          "give a Python file that defines make_step()")
    return path


def load_step(script: str | os.PathLike, entry: str | None = None):
    """The training step a script defines, for `gpulab diagnose`: the script runs as a module (its
    `if __name__ == "__main__":` block does not), then `entry` is looked up; by default `make_step`
    (called with no arguments, it returns the step) and else `step` (the step itself). ScriptError (a
    ValueError), in one line, for a missing script, a folder or a notebook, a script whose code fails
    while loading or whose `make_step()` raises (naming the user's file and line), a missing entry
    and an entry that is not callable."""
    import runpy
    path = check_script(script)
    try:
        namespace = runpy.run_path(str(path), run_name="__gpulab_diagnose__")
    except (Exception, SystemExit) as err:
        raise _load_error(err, path, "") from err
    names = (entry,) if entry else STEP_NAMES
    found = next((n for n in names if n in namespace), None)
    if found is None:
        raise ScriptError(f"{path} defines no {' or '.join(repr(n) for n in names)}: give it a function "
                          "`step()` that fetches one batch and trains on it (or `make_step()` that returns one), "
                          "or name yours with --entry")
    obj = namespace[found]
    if not callable(obj):
        raise ScriptError(f"{path}: {found!r} is not callable")
    if found == "make_step" and not entry:
        try:
            obj = obj()
        except (Exception, SystemExit) as err:
            raise _load_error(err, path, "make_step()") from err
        if not callable(obj):
            raise ScriptError(f"{path}: make_step() returned {type(obj).__name__}, not a callable step")
    return obj


def check_settings() -> None:
    """SettingError (a ValueError), in one line, for a GPULAB_DEVICE, GPULAB_SCALE or GPULAB_PROFILE this
    machine cannot honour: a value not understood, or cuda without a GPU."""
    from gpulab.core.device import pick_device, profile, resolve_scale
    pick_device()                      # GPULAB_DEVICE: a bad value, or cuda without a GPU
    resolve_scale()                    # GPULAB_SCALE
    profile()                          # GPULAB_PROFILE


def diagnose(argv: list[str] | None = None) -> int:
    """`gpulab diagnose SCRIPT`: diagnose the training step a script defines; exit 0; 2, as one line on
    stderr, for a setting this machine cannot honour (GPULAB_DEVICE, GPULAB_SCALE, GPULAB_PROFILE), bad
    counts, an output path that cannot be written, or a script that gives no step (missing, a folder, a
    syntax error, a failing import, `make_step()` raising: with the user's file and line); 1, as one line
    with the file and line, when the step itself raised while being diagnosed. The trace and the timeline
    go beside the script unless --trace / --plot name a path."""
    parser = argparse.ArgumentParser(
        prog="gpulab diagnose",
        description="Which bottleneck is your training step's, and what would fixing it buy? "
                    "Profiles a few steps of SCRIPT's `make_step()` or `step()`.")
    parser.add_argument("script", help="a Python file defining make_step() (returns the step) or step()")
    parser.add_argument("--entry", default=None, help="the function's name, if not make_step or step")
    parser.add_argument("--warmup", type=int, default=3, help="unprofiled steps first (default 3)")
    parser.add_argument("--steps", type=int, default=5, help="steps timed, and steps profiled (default 5)")
    parser.add_argument("--trace", metavar="PATH", default=None,
                        help="the profiler trace, for Perfetto or chrome://tracing "
                             "(default: beside SCRIPT, named STEM-trace.json: train.py gives train-trace.json)")
    parser.add_argument("--plot", metavar="PATH", default=None,
                        help="the timeline picture (default: beside SCRIPT, named STEM-timeline.png)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the diagnosis as JSON")
    args = parser.parse_args(argv)
    script = Path(args.script)
    stem = script.stem
    trace = args.trace or str(script.parent / f"{stem}-trace.json")
    plot = args.plot or str(script.parent / f"{stem}-timeline.png")
    try:
        check_settings()               # first: a bad setting is said before anything of the script runs
        if args.warmup < 0 or args.steps < 1:
            raise ValueError(f"--warmup must be >= 0 and --steps >= 1 (got {args.warmup} and {args.steps})")
        check_script(args.script)      # before the output paths, which default to the script's folder
        for target, what, flag in ((trace, "the trace", args.trace is None and "--trace"),
                                   (plot, "the timeline", args.plot is None and "--plot"),
                                   (args.json, "the JSON", False)):
            if target:
                try:
                    _check_writable(target, what)
                    if not Path(target).parent.is_dir():
                        raise ValueError(f"cannot write {what} to {target} (no folder {Path(target).parent})")
                except ValueError as err:
                    raise ValueError(f"{err}; give another place with {flag} PATH" if flag else str(err)) from None
        sys.path.insert(0, str(script.resolve().parent))   # the script's own imports
        step = load_step(args.script, args.entry)
    except ValueError as err:          # SettingError and ScriptError are ValueErrors
        print(f"gpulab diagnose: {_one_line(err)}", file=sys.stderr)
        return 2
    from gpulab.diagnose import DiagnoseError, diagnose as run_diagnosis
    try:
        d = run_diagnosis(step, warmup=args.warmup, steps=args.steps, trace_path=trace, label=stem)
    except DiagnoseError as err:      # the learner's step raised: say so, in one line, where in their code
        where, cause = None, err.__cause__
        while cause is not None and where is None:   # the step's own error, under any DiagnoseError wrapping it
            where = user_frame(cause.__traceback__, script)
            cause = cause.__cause__
        print(f"gpulab diagnose: {where + ': ' if where else ''}{_one_line(err)}", file=sys.stderr)
        return 1
    print(d.report())
    d.plot().savefig(plot, dpi=120)
    print(f"timeline: {plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(d.to_dict(), indent=1) + "\n", encoding="utf-8")
        print(f"JSON: {args.json}")
    return 0


USAGE = """usage: gpulab doctor [--cpu-ok] [--json]
       gpulab bench [--scale tiny|full|auto] [--lessons 03,05] [--json PATH] [--check] [--bands PATH] [--no-suite]
       gpulab room FOLDER [--png out.png] [--json out.json] [--markdown]
       gpulab report [--readme docs/results.md] [--results results]
       gpulab diagnose SCRIPT [--entry NAME] [--steps 5] [--trace PATH] [--plot PATH] [--json PATH]

  doctor   check that this machine is ready for the course
  bench    run each lesson's headline comparison; --check fails when a ratio leaves its band
  room     merge a folder of learners' results files into one comparison across GPUs
  report   print (or, with --readme, rewrite) the "measured on" block of docs/results.md
  diagnose profile your own training step (SCRIPT's make_step() or step()): where its time goes,
           which bottleneck it has, and the most fixing it can buy"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"doctor": doctor, "bench": bench, "room": room, "report": report, "diagnose": diagnose}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(USAGE)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
