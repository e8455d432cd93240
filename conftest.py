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


def pytest_runtest_teardown(item):
    if _OUTPUTS and getattr(item, "test_outputs", None) is not None:
        import json
        with open(_OUTPUTS, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "outputs": _text_outputs(item.test_outputs)}) + "\n")


def pytest_sessionstart(session):
    if _TIMINGS:
        _timing_line(0.0, "(session)", "start")


def pytest_runtest_logreport(report):
    if _TIMINGS and report.when == "call":
        _timing_line(report.duration, report.nodeid, report.outcome)
