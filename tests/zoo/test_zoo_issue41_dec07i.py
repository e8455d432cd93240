"""results/zoo/2026-12-07-h100-issue41-i/: what a new shape costs in eager PyTorch on one H100. Its NOTES.md quotes
each op's first and second call at three new lengths and the fairseq step's top ops at a new shape: read back here."""
import json
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / "results" / "zoo" / "2026-12-07-h100-issue41-i"
DATA = json.loads((RUN / "new-shape-cost.json").read_text())
NOTES = " ".join((RUN / "NOTES.md").read_text().split())
ROWS = {"sdpa causal fwd+bwd": "SDPA, causal", "sdpa masked fwd+bwd": "SDPA, with a mask", "linear fwd+bwd": "linear",
        "cross_entropy fwd+bwd": "cross_entropy"}


def ms(x: float) -> str:
    return f"{x:.0f} ms" if x >= 1000 else f"{x:.3g} ms"


def test_the_table_is_the_files():
    for op, label in ROWS.items():
        cells = [f"{ms(r['first_ms'])}, then {ms(r['second_ms'])}" for r in DATA["ops"] if r["op"] == op]
        assert f"| {label} | " + " | ".join(cells) + " |" in NOTES


def test_attention_pays_for_each_new_length_and_the_step_shows_it():
    later = [r["first_ms"] for r in DATA["ops"] if r["op"].startswith("sdpa") and r["T"] != 37]
    assert f"cost {min(later):.0f}-{max(later):.0f} ms, forward and backward, against about 1 ms after" in NOTES
    assert all(r["second_ms"] < 1.5 for r in DATA["ops"] if r["op"].startswith("sdpa"))
    new = {k: v for k, v in DATA["fairseq"].items() if k.startswith("new")}
    (name, step), = new.items()
    top = {key: t for key, t, _ in step["top"]}
    (old,) = [v for k, v in DATA["fairseq"].items() if k.startswith("repeated")]
    attention = top["aten::_cudnn_attention_backward"] + top["aten::_cudnn_attention_forward"]
    assert f"that is {attention:.0f} ms of the {step['ms'] - old['ms']:.0f} ms the new shape added" in NOTES
    assert step["top"][0][0] == "aten::_cudnn_attention_backward" and step["top"][1][0] == "aten::_cudnn_attention_forward"
    assert f"{old['ms']:.1f} ms and {step['ms']:.1f} ms" in NOTES
