import os
import subprocess
import sys
import time

import pytest

from gpulab.core.children import at_once


def test_runs_every_command_and_keeps_each_output_and_environment():
    env = dict(os.environ, GPULAB_CHILD_TEST="from the env")
    done = at_once({"a": [sys.executable, "-c", "print('a')"],
                    "b": ([sys.executable, "-c", "import os; print(os.environ['GPULAB_CHILD_TEST'])"], env),
                    "c": [sys.executable, "-c", "import sys; sys.exit(3)"]}, timeout_s=60)
    assert list(done) == ["a", "b", "c"]
    assert done["a"].stdout.strip() == "a" and done["a"].returncode == 0
    assert done["b"].stdout.strip() == "from the env"
    assert done["c"].returncode == 3


def test_they_run_at_the_same_time():
    start = time.monotonic()
    at_once({i: [sys.executable, "-c", "import time; time.sleep(1.5)"] for i in range(3)}, timeout_s=60)
    assert time.monotonic() - start < 4.0            # one after another would take 4.5 s or more


def test_an_overrun_raises_and_leaves_no_process_behind():
    with pytest.raises(subprocess.TimeoutExpired):
        at_once({"slow": [sys.executable, "-c", "import time; time.sleep(30)"]}, timeout_s=0.5)
