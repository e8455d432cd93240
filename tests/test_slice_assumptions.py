"""A notebook or lesson that assumes a figure a MIG slice does not have fails here: the SM count, NVML's
utilization and P2P are read only through the course's own layer (gpulab.core.device's facts, the
monitor, lesson 14's link_info), which answers for the slice under its profile. Reading them straight
from CUDA or NVML anywhere else would show the whole GPU's 132 SMs, its utilization, its peers."""
import json
import re
from pathlib import Path

import pytest

from gpulab.core.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[1]
DIRECT = {
    "SM count": re.compile(r"multi_processor_count"),
    "NVML utilization": re.compile(r"nvmlDeviceGetUtilizationRates"),
    "P2P": re.compile(r"can_device_access_peer|nvmlDeviceGetP2PStatus"),
}
# the one place each is read (and made to answer for a slice)
ALLOWED = {
    # the facts; doctor's raw device line; roomrun --mps: the whole GPU's count (to size each learner's MPS share,
    # read in a child process outside any profile) and the count MPS gave a probe client (what the room reports)
    "SM count": {"gpulab/core/device.py", "gpulab/tools/cli.py", "gpulab/tools/roomrun.py"},
    "NVML utilization": {"gpulab/core/monitor.py"},
    "P2P": {"gpulab/lessons/multigpu/allreduce.py"},
}


def _sources():
    for path in sorted((ROOT / "gpulab").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        yield path.relative_to(ROOT).as_posix(), "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("figure", sorted(DIRECT))
def test_nothing_reads_a_figure_a_slice_lacks_around_the_course_layer(figure):
    found = [where for where, text in _sources() if DIRECT[figure].search(text) and where not in ALLOWED[figure]]
    assert not found, (f"{', '.join(found)} read the {figure} straight from CUDA or NVML: under a MIG-slice "
                       f"profile ({', '.join(k for k, p in PROFILES.items() if p.mig)}) that is the whole GPU's; "
                       "read it through gpulab.core.device.device_facts / the monitor / lesson 14's link_info")


def test_the_course_layer_answers_for_the_slice(monkeypatch):
    """Under the slice profile on the CPU: its SM count in the facts, no NVML utilization, no P2P."""
    from gpulab.core import device, monitor
    from gpulab.lessons.multigpu import allreduce as L14
    monkeypatch.setenv("GPULAB_PROFILE", "h200-1g")
    assert device.device_facts().sm_count == 16
    assert "no NVML utilization" in monitor.slice_without_utilization()
    link = L14.link_info([0, 1])
    assert link["peer_access"] is False and "no P2P" in link["summary"]
    monkeypatch.setenv("GPULAB_PROFILE", "h200")                # a whole GPU: this device's SMs (none on a CPU)
    assert monitor.slice_without_utilization() == "" and device.device_facts().sm_count is None


def test_the_check_can_fail():
    """A planted direct read is caught."""
    planted = [("notebooks/99_x.ipynb", "sms = torch.cuda.get_device_properties(0).multi_processor_count")]
    found = [w for w, t in planted if DIRECT["SM count"].search(t) and w not in ALLOWED["SM count"]]
    assert found == ["notebooks/99_x.ipynb"]


def test_an_emulated_slice_says_its_bandwidth_is_not_a_slices(monkeypatch):
    """A green context gives the slice's SMs but not its share of the memory: where one limits this process,
    notebook 04's "best Triton / copy ceiling" check is skipped with that reason (it FAILed at 1.26 under
    h200-1g on the H200, results/room/2026-12-02-h200-time-sliced-00-01-04); with no green context it is judged."""
    from gpulab.core import device
    monkeypatch.setenv("GPULAB_PROFILE", "h200-1g")
    monkeypatch.setattr(device, "SM_LIMIT", {"sms": None, "why": "not on a GPU"})
    assert device.slice_bandwidth_note() == ""
    monkeypatch.setattr(device, "SM_LIMIT", {"sms": 16, "why": "a green context of 16 SMs"})
    note = device.slice_bandwidth_note()
    assert "h200-1g" in note and "16 SMs" in note and "not the memory system" in note
    nb = json.loads((ROOT / "notebooks" / "04_occupancy_and_waves.ipynb").read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "applies=applies and not slice_note" in code


BANDWIDTH_CEILING = re.compile(r"\bbw\.value\b|\bfloor_ms\b")      # a check against 00's memory bandwidth


def bandwidth_checks(code: str) -> list[tuple[str, str]]:
    """(the check's value, its `applies`) of every `lesson.expect(...)` in `code` whose value is measured
    against a memory-bandwidth ceiling (00's streams as `bw.value`, a memory floor as `floor_ms`)."""
    import ast
    found = []
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())   # magics
    for node in ast.walk(ast.parse(code)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "expect"
                and len(node.args) >= 2 and BANDWIDTH_CEILING.search(ast.unparse(node.args[1]))):
            applies = next((ast.unparse(k.value) for k in node.keywords if k.arg == "applies"), "")
            found.append((ast.unparse(node.args[1]), applies))
    return found


def test_every_check_against_a_memory_ceiling_knows_an_emulated_slice():
    """A check that holds a kernel to the memory bandwidth (00's streams, a memory floor) cannot be judged
    under a green context, which gives the slice's SMs and the whole GPU's memory: each such check does not
    apply where `slice_bandwidth_note()` says one limits this process. Notebook 12's floor check FAILed at
    0.599 under h200-1g on the H200 without it (results/profiles/2026-12-02-h200-h200-1g-09-to-15), notebook 04's Triton
    check at 1.26 (room-a)."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                for value, applies in bandwidth_checks("".join(cell["source"])):
                    found[(path.name, value)] = applies
    assert {name for name, _ in found} >= {"04_occupancy_and_waves.ipynb", "12_kernel_fusion.ipynb"}, found
    blind = [f"{name}: {value}" for (name, value), applies in found.items() if "not slice_note" not in applies]
    assert not blind, ("a check against a bandwidth ceiling that still applies under an emulated slice "
                       f"(add `and not slice_note`, slice_note = slice_bandwidth_note()): {blind}")


def test_the_bandwidth_check_finder_can_fail():
    planted = 'lesson.expect("x", fused_ms / floor_ms, low=0.9, applies=on_gpu)'
    assert bandwidth_checks(planted) == [("fused_ms / floor_ms", "on_gpu")]
    assert bandwidth_checks('lesson.expect("y", eager_ms / predicted_ms, applies=on_gpu)') == []
