"""zoo/README.md's sixth run and results/zoo/2026-12-02-h200-run-n/matrix-h200-2026-12-02-n.txt come from run N's committed files:
the held-out step's label and diagnosis, reduce_overhead_skipped's diagnosis, and labels d."""
import json
import math
from pathlib import Path

from gpulab.diagnose import zoo as Z

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "results" / "zoo"


def _file(name):
    """A committed zoo file by its name, in whichever run folder of results/zoo/ holds it."""
    found = sorted(RES.rglob(name))
    assert len(found) == 1, f"{name}: {len(found)} entries of that name under results/zoo/"
    return found[0]


def _steps(name):
    return json.loads(_file(name).read_text())["steps"]


def test_run_ns_matrix_and_the_readmes_figures():
    held = _steps("labels-h200-2026-12-02-n.json")
    labels = [s for s in _steps("labels-h200-2026-12-02-d.json") if s["name"] == "reduce_overhead_skipped"] + held
    diagnoses = _steps("diagnoses-h200-2026-12-02-n.json")
    result = Z.judge(labels, diagnoses)
    assert Z.matrix_text(result) == _file("matrix-h200-2026-12-02-n.txt").read_text().rstrip("\n")
    kept = {m[0]: m for m in result["measured"]}
    promise = {d["name"]: next(v for v in d["verdicts"] if v["rule"] == "cudagraphs_skipped")["expected_gain"]
               for d in diagnoses}
    readme = " ".join((ROOT / "zoo" / "README.md").read_text().split())
    h = "gpt_masked_targets_reduce_overhead"
    assert (f"promised {promise[h]:.3g}x and the fix measured {kept[h][2]:.3g}x ({100 * kept[h][5]:.0f} %" in readme
            and kept[h][4] and not math.isnan(kept[h][5]))
    r = "reduce_overhead_skipped"
    assert f"promised {promise[r]:.3g}x against its label's {kept[r][2]:.3g}x: {100 * kept[r][5]:.0f} % kept" in readme
    written_d = next(s for s in labels if s["name"] == r)["as_written"]["ms"]
    written_n = next(d for d in diagnoses if d["name"] == r)["step_ms"]
    earlier = {run: next(d for d in _steps(f"diagnoses-h200-2026-12-02-{run}-by-ae6056d.json") if d["name"] == r)
               for run in ("h", "g")}
    kept_earlier = {run: Z.judge([labels[0]], [d])["measured"][0][5] for run, d in earlier.items()}
    assert (f"kept {100 * kept_earlier['h']:.0f} % and {100 * kept_earlier['g']:.0f} % on runs H's and G's records, "
            f"where the step as written took {earlier['h']['step_ms']:.3g} and {earlier['g']['step_ms']:.3g} ms, "
            f"as fast as when labels d timed it ({written_d:.3g} ms); here it took {written_n:.3g} ms") in readme
    written_h = next(s for s in held if s["name"] == h)
    cut = lambda gain: 100 * (1 - 1 / gain)
    assert (f"it removed {cut(written_h['best_gain']):.0f} % of the step where {cut(promise[h]):.0f} % was promised"
            in readme)
    # run N's own notes say the same
    row = " ".join((RES / "2026-12-02-h200-run-n" / "NOTES.md").read_text().split())
    assert (f"as written {written_h['as_written']['ms']:.3g} ms, its fix {written_h['fixes']['cudagraphs_skipped']['ms']:.3g} ms, "
            f"{kept[h][2]:.3g}x" in row and f"promised {promise[h]:.3g}x, {100 * kept[h][5]:.0f} % kept" in row
            and f"promised {promise[r]:.3g}x against labels d's {kept[r][2]:.3g}x, {100 * kept[r][5]:.0f} % kept" in row
            and f"took {written_n:.3g} ms as written here, {written_d:.3g} ms when labels d timed it" in row)
