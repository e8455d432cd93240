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


def pytest_sessionstart(session):
    if _TIMINGS:
        _timing_line(0.0, "(session)", "start")


def pytest_runtest_logreport(report):
    if _TIMINGS and report.when == "call":
        _timing_line(report.duration, report.nodeid, report.outcome)
