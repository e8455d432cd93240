"""Root pytest configuration: keep test runs out of the learner's own results file.

The notebooks (run by nbval in a kernel that inherits this environment) record
their measurements in the results store. Unless GPULAB_RESULTS is set on purpose
(to keep a GPU run's figures), a test run writes to a throw-away file.
"""
import os
import tempfile

if "GPULAB_RESULTS" not in os.environ:
    os.environ["GPULAB_RESULTS"] = os.path.join(tempfile.mkdtemp(prefix="gpulab-test-"), "results.json")
