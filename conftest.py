"""Root pytest configuration: keep test runs out of the learner's own results file.

The notebooks (run by nbval in a kernel that inherits this environment) record
their measurements in the results store. Unless GPULAB_RESULTS is set on purpose
(to keep a GPU run's figures), a test run writes to a throw-away file.
"""
import os
import tempfile

if "GPULAB_RESULTS" not in os.environ:
    os.environ["GPULAB_RESULTS"] = os.path.join(tempfile.mkdtemp(prefix="gpulab-test-"), "results.json")


# GPULAB_TIMINGS=path: append "seconds<TAB>test id" for every test as it finishes (nbval: one line per
# notebook cell). Written line by line, so a run stopped by a time limit still says where its time went;
# `python -m gpulab.coursetime path` sums it per notebook.
_TIMINGS = os.environ.get("GPULAB_TIMINGS")


def pytest_runtest_logreport(report):
    if _TIMINGS and report.when == "call":
        with open(_TIMINGS, "a") as f:
            f.write(f"{report.duration:.3f}\t{report.nodeid}\t{report.outcome}\n")
