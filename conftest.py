"""Root pytest configuration: keep test runs out of the learner's own results file.

The notebooks (run by nbval in a kernel that inherits this environment) record
their measurements in the results store. Unless GPULAB_RESULTS is set on purpose
(to keep a GPU run's figures), a test run writes to a throw-away file.
"""
import os
import tempfile

if "GPULAB_RESULTS" not in os.environ:
    os.environ["GPULAB_RESULTS"] = os.path.join(tempfile.mkdtemp(prefix="gpulab-test-"), "results.json")


# GPULAB_TIMINGS=path: append "seconds<TAB>test id<TAB>outcome<TAB>clock" for every test as it finishes
# (nbval: one line per notebook cell; clock: Unix time at the end, so the wall time per notebook, kernel
# start-up included, can be read too), after a "start" line for the session. Written line by line, so a
# run stopped by a time limit still says where its time went; `python -m gpulab.tools.coursetime path` sums it.
# Under pytest-xdist (`-n 2`, setup.sh test without a GPU) the workers' lines interleave: the sums hold,
# the wall times per file do not (GPU runs are run in one process).
_TIMINGS = os.environ.get("GPULAB_TIMINGS")


def _timing_line(seconds, nodeid, outcome):
    import time
    with open(_TIMINGS, "a") as f:
        f.write(f"{seconds:.3f}\t{nodeid}\t{outcome}\t{time.time():.3f}\n")


# GPULAB_OUTPUTS=path: append one JSON line per notebook cell nbval ran: its test id and its text outputs
# (streams, text/plain and errors; images and HTML left out), so a GPU run's printed tables come back
# with its records (nbval itself keeps no outputs).
_OUTPUTS = os.environ.get("GPULAB_OUTPUTS")


def _text_outputs(outputs) -> list[str]:
    texts = []
    for out in outputs or ():
        kind = out.get("output_type")
        if kind == "stream":
            texts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data") and "text/plain" in out.get("data", {}):
            if not any(k.startswith("image/") for k in out["data"]):
                texts.append(out["data"]["text/plain"])
        elif kind == "error":
            texts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return texts


# Memory checks that can fail (issue 40, item 2). Where the notebooks run on the CPU (CI), nbval runs them
# - counting: GPULAB_MEMORY_CPU=1, "allocated" is the bytes of the live CPU tensors (gpulab.core.memory);
# - strict: GPULAB_MEMORY_STRICT=1, a failed memory check raises MemoryNotReturned and fails its cell;
# - planted: GPULAB_MEMORY_PLANT bytes (8 MiB) left allocated right after each notebook's first code cell, as a
#   cell that forgot a tensor would. Every check that compares with the notebook's start must count them
#   (PlantNotSeen if not, naming the bytes), then leaves them out of its verdict: the same run is the control.
# A value set on purpose is kept (GPULAB_MEMORY_PLANT=0: no plant); on a GPU none is set. The unit tests under
# tests/ run without them (tests/conftest.py).
MEMORY_MODES = {"GPULAB_MEMORY_CPU": "1", "GPULAB_MEMORY_STRICT": "1", "GPULAB_MEMORY_PLANT": str(8 * 2**20),
                # and the graded exercises' cells: a check of the notebook's own code (as given, or the lesson's
                # fix) that was refused, crashed or was not CORRECT raises NotGraded (gpulab.exercises.exercise)
                "GPULAB_GRADING_STRICT": "1"}


def _notebooks_on_cpu() -> bool:
    if os.environ.get("GPULAB_DEVICE") == "cpu":
        return True
    import torch
    return not torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    cells = [item for item in items if type(item).__name__ == "IPyNbCell"]
    if not cells or not _notebooks_on_cpu():
        return
    for name, value in MEMORY_MODES.items():       # before any notebook's kernel starts: it inherits them
        os.environ.setdefault(name, value)
    plant = int(os.environ["GPULAB_MEMORY_PLANT"] or 0)
    first = {}
    for item in cells:
        first.setdefault(id(item.parent), item)      # the notebook's first code cell
    for item in first.values():
        if plant > 0:
            item.cell.source += ("\n__import__('gpulab.core.memory', fromlist=['plant_leak'])"
                                 f".plant_leak({plant})   # the planted-leak test (conftest.py)")


def pytest_runtest_teardown(item):
    if _OUTPUTS and getattr(item, "test_outputs", None) is not None:
        import json
        with open(_OUTPUTS, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "outputs": _text_outputs(item.test_outputs)}) + "\n")


def pytest_sessionstart(session):
    if _TIMINGS and not hasattr(session.config, "workerinput"):     # one start line, not one per xdist worker
        _timing_line(0.0, "(session)", "start")


_CONFIG = None


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config


def _xdist_controller() -> bool:
    """True in pytest-xdist's controlling process (`-n N`): its workers write the lines of the tests they ran."""
    return _CONFIG is not None and _CONFIG.pluginmanager.hasplugin("dsession")


def pytest_runtest_logreport(report):
    if _TIMINGS and report.when == "call" and not _xdist_controller():
        _timing_line(report.duration, report.nodeid, report.outcome)
