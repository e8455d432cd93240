"""Issue 15: every figure in a notebook's prose is held to a committed record.

A measured figure in a markdown cell carries a tag, an HTML comment right after it (invisible in
Jupyter):

    took 109 ms<!-- fig 03 step_ms_0_workers -->
    55–68 %<!-- fig 03 step_ms_12_workers.gpu_busy_pct -->     (a range: both ends are checked)
    0.78×<!-- fig 06 some_ratio tol=10 -->
    a fraction quoted in %: 12 %<!-- fig 07 share x100 -->

`<!-- fig LESSON NAME [xK] [tol=P] -->`: the number just before the tag (only unit text and spaces
between them; "1,234", decimals and ranges "a–b", "a-b", "a to b" allowed), divided by K (default
1), must lie within [min·(1−P %), max·(1+P %)] (P default 5) of the values of the committed records
with that lesson and name: every results store under results/ ({"records": [...]}), records made on
a GPU (`gpu` not "CPU") at scale "full", not under a GPU profile (no `extra["profile"]`) and not on a
shared GPU (no `extra["shared"]`: other processes, a room, a MIG slice).
`NAME.KEY` reads `extra[KEY]` of the records named NAME instead of their value.

A figure that is not a measurement on our GPU says so: `9.8 GB<!-- not measured: arithmetic -->`.

Untagged figures: in a sentence that mentions the H200 or a measurement verb (measured, took, ran
at, reached, recorded, in two runs), every number with a unit of time, rate, ratio or share (ms, µs,
us, s, GB/s, TB/s, TFLOP/s, ×, x right after the number, %, tokens/s, img/s, images/s, iter/s) must
carry a fig tag or a not-measured tag. Numbers in inline or fenced code are not prose.

The checker is plain functions of text and records, tested at the bottom of this file on
synthetic markdown.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

from gpulab.core import figures as F
from gpulab.core.figures import NOT_RUN, Rec, beside, check_markdown, prose_figures

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@lru_cache(maxsize=1)
def committed_records() -> tuple[Rec, ...]:
    return F.committed_records(ROOT)


# -- the committed records and the notebooks -------------------------------------------------------
def notebook_problems(path: Path) -> list[str]:
    problems = []
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            problems += check_markdown("".join(cell["source"]), committed_records(),
                                       where=f"{path.name} cell {i}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_figure_in_prose_is_held_to_a_committed_record(path):
    problems = notebook_problems(path)
    assert not problems, f"{len(problems)} figure(s) in prose:\n" + "\n".join(problems)


def test_the_committed_records_are_found():
    assert len(committed_records()) > 100
    assert any(r.gpu != "CPU" and r.scale == "full" for r in committed_records())


# -- the checker on synthetic markdown -------------------------------------------------------------
RECS = [Rec("03", "step_ms_0_workers", 105.3, source="results/a.json"),
        Rec("03", "step_ms_0_workers", 124.8, source="results/b.json"),
        Rec("03", "busy_frac", 0.55), Rec("03", "busy_frac", 0.68),
        Rec("03", "step_ms_12_workers", 10.6, extra={"gpu_busy_pct": 52.5}),
        Rec("03", "step_ms_12_workers", 11.0, extra={"gpu_busy_pct": 68.0}),
        Rec("03", "cpu_only", 5.0, gpu="CPU"), Rec("03", "tiny_only", 5.0, scale="tiny"),
        Rec("03", "profiled", 5.0, extra={"profile": "t4"}),
        Rec("03", "shared_only", 5.0, extra={"shared": "1 other process(es) compute on this GPU"}),
        Rec("01", "first_ms", 1234.5)]


def test_a_tagged_figure_inside_the_range_passes():
    assert check_markdown("On the H200 a step took 109 ms<!-- fig 03 step_ms_0_workers -->.", RECS) == []
    # 5 % tolerance at both edges: 100.1 >= 105.3 * 0.95, 131 <= 124.8 * 1.05
    assert check_markdown("It took 100.1 ms<!-- fig 03 step_ms_0_workers --> then "
                          "131 ms<!-- fig 03 step_ms_0_workers -->.", RECS) == []
    assert check_markdown("It took 1,234.5 ms<!-- fig 01 first_ms --> the first time.", RECS) == []


def test_a_tagged_figure_outside_the_range_fails():
    problems = check_markdown("On the H200 a step took 90 ms<!-- fig 03 step_ms_0_workers -->.", RECS)
    assert len(problems) == 1
    assert "90" in problems[0] and "outside" in problems[0] and "2 records" in problems[0]
    assert "a.json" in problems[0] and "b.json" in problems[0] and "took 90 ms" in problems[0]
    assert check_markdown("took 140 ms<!-- fig 03 step_ms_0_workers tol=20 -->", RECS) == []
    assert check_markdown("took 140 ms<!-- fig 03 step_ms_0_workers -->", RECS)


def test_a_tag_naming_no_record_fails():
    for name in ("no_such_record", "cpu_only", "tiny_only", "profiled", "shared_only"):   # none is a reference
        problems = check_markdown(f"It took 5 ms<!-- fig 03 {name} -->.", RECS, where="nb 01 cell 4")
        assert len(problems) == 1 and "no committed record" in problems[0], (name, problems)
        assert problems[0].startswith("nb 01 cell 4") and "took 5 ms" in problems[0]
    assert check_markdown("It took 5 ms<!-- fig 04 step_ms_0_workers -->.", RECS)   # other lesson


def test_scaling_by_k():
    assert check_markdown("busy 60 %<!-- fig 03 busy_frac x100 --> of the time", RECS) == []
    assert check_markdown("busy 80 %<!-- fig 03 busy_frac x100 --> of the time", RECS)
    assert check_markdown("took 0.11 s<!-- fig 03 step_ms_0_workers x0.001 -->", RECS) == []
    assert check_markdown("took 0.2 s<!-- fig 03 step_ms_0_workers x0.001 -->", RECS)


def test_a_range_checks_both_ends():
    assert check_markdown("The H200 was busy 55–68 %<!-- fig 03 busy_frac x100 -->.", RECS) == []
    assert check_markdown("The H200 was busy 55 to 68 %<!-- fig 03 busy_frac x100 -->.", RECS) == []
    low = check_markdown("The H200 was busy 34–68 %<!-- fig 03 busy_frac x100 -->.", RECS)
    high = check_markdown("The H200 was busy 55-90 %<!-- fig 03 busy_frac x100 -->.", RECS)
    assert len(low) == 1 and low[0].split(":")[1].strip().startswith("34")
    assert len(high) == 1 and high[0].split(":")[1].strip().startswith("90")


def test_an_extra_field_is_read_with_name_dot_key():
    assert check_markdown("busy 55–68 %<!-- fig 03 step_ms_12_workers.gpu_busy_pct -->", RECS) == []
    assert check_markdown("busy 34 %<!-- fig 03 step_ms_12_workers.gpu_busy_pct -->", RECS)
    assert "no committed record" in check_markdown("busy 3 %<!-- fig 03 step_ms_12_workers.nope -->", RECS)[0]


def test_an_untagged_figure_in_a_measured_sentence_fails():
    problems = check_markdown("On the H200 the first product took 12 ms, against 2.7 ms warm.", RECS)
    assert len(problems) == 2 and all("untagged" in p for p in problems)
    assert "'12 ms'" in problems[0] and "'2.7 ms'" in problems[1]
    for s in ("We measured 9.5x here.", "It ran at 4,100 GB/s.", "The H200 reached 75.6 %.",
              "In two runs: 83–126 ms.", "took 31.6 µs per call", "recorded 1.2 TFLOP/s",
              "The H200 ran 3 × faster.", "took 2 s.", "The H200: 900 tokens/s and 50 img/s."):
        assert check_markdown(s, RECS), s


def test_untagged_figures_that_are_not_measurements_pass():
    assert check_markdown("On the H200 a step takes 4.8 TB/s<!-- not measured: datasheet --> at best.", RECS) == []
    assert check_markdown("On the H200 9.8 GB<!-- not measured: arithmetic --> of state.", RECS) == []  # GB: no rate
    assert check_markdown("A 2x faster step saves 50 % of the time.", RECS) == []           # no trigger
    assert check_markdown("The H200 has 132 SMs and 141 GB.", RECS) == []                  # no unit listed
    assert check_markdown("On the H200, `took 12 ms` is code.", RECS) == []                # inline code
    assert check_markdown("On the H200:\n```\nit took 12 ms\n```\n", RECS) == []            # fenced code
    assert check_markdown("The H200 ran a 4096x4096 product in fp32.", RECS) == []          # a shape, not a ratio
    # a sentence without a trigger word does not borrow the next one's
    assert check_markdown("A step is 12 ms. The H200 is a GPU.", RECS) == []


def test_sentences_split_at_list_items_and_table_rows():
    md = "Intro line\n- the H200 took 12 ms\n- a 2x gain\n\n| H200 | 3 ms |\n| CPU | 5 ms |"
    problems = check_markdown(md, RECS)
    assert len(problems) == 2 and "12 ms" in problems[0] and "3 ms" in problems[1]


def test_a_tag_without_a_number_or_with_a_bad_option_fails():
    assert "no number" in check_markdown("It took <!-- fig 03 step_ms_0_workers --> long.", RECS)[0]
    assert "unknown option" in check_markdown("took 109 ms<!-- fig 03 step_ms_0_workers y5 -->", RECS)[0]
    assert "needs a lesson" in check_markdown("took 109 ms<!-- fig 03 -->", RECS)[0]


# -- the learner's value beside the reference --------------------------------------------------------
def test_prose_figures_reads_each_tagged_figure_with_its_sentence():
    md = "On the H200 a step took 109 ms<!-- fig 03 step_ms_0_workers -->. Busy 55–68 %<!-- fig 03 busy_frac x100 -->."
    figs = prose_figures(md)
    assert [(f.shown, f.values, f.tag.name, f.tag.k) for f in figs] == [
        ("109", (109.0,), "step_ms_0_workers", 1.0), ("55–68", (55.0, 68.0), "busy_frac", 100.0)]
    assert figs[0].sentence.startswith("On the H200 a step took 109 ms")


def test_a_sentence_keeps_its_code_words_but_not_their_numbers():
    """The sentence shown beside a figure keeps an inline code span without digits (it read "this CNN in bf16
    with ran 3.3x" in notebook 13's table, `channels_last` dropped); a span with digits is still no figure."""
    md = "This CNN in bf16 with `channels_last` ran 3.3×<!-- fig 13 cnn_half_channels_last_speedup --> at `n = 4096`."
    figs = prose_figures(md)
    assert [f.shown for f in figs] == ["3.3"]
    assert " ".join(figs[0].sentence.split()).startswith("This CNN in bf16 with channels_last ran 3.3×")
    assert "4096" not in figs[0].sentence


def test_beside_puts_the_learners_newest_value_next_to_the_reference_and_names_the_regime():
    from types import SimpleNamespace as R
    md = ["A step took 109 ms<!-- fig 03 step_ms_0_workers --> and was busy 60 %<!-- fig 03 busy_frac x100 -->. "
          "It ran 10.8 ms<!-- fig 03 step_ms_12_workers --> with workers."]
    mine = [R(lesson="03", name="step_ms_0_workers", value=80.0, gpu="NVIDIA H200", scale="full", extra={}),
            R(lesson="03", name="step_ms_0_workers", value=90.0, gpu="NVIDIA H200", scale="full", extra={}),
            R(lesson="03", name="busy_frac", value=0.5, gpu="Tesla T4", scale="full", extra={}),
            R(lesson="03", name="step_ms_12_workers", value=3.0, gpu="CPU", scale="tiny", extra={})]
    rows = beside("03", mine, "NVIDIA H200", references=RECS, markdown=md)
    assert [r["figure"] for r in rows] == ["109", "60", "10.8"]
    first, busy, workers = rows
    assert first["yours"] == 90.0 and first["regime"] == "same GPU"            # the newest of two
    assert first["reference_range"] == (105.3, 124.8) and "a.json (NVIDIA H200)" in first["reference"]
    assert busy["yours"] == pytest.approx(50.0) and busy["regime"] == "another GPU (Tesla T4)"  # scaled x100
    assert workers["regime"] == "tiny size (CPU)"
    profiled = [R(lesson="03", name="busy_frac", value=0.5, gpu="NVIDIA H200", scale="full", extra={"profile": "t4"})]
    assert beside("03", profiled, "NVIDIA H200", RECS, md)[1]["regime"] == "emulating t4"
    assert beside("03", [], "NVIDIA H200", RECS, md)[0]["regime"] == NOT_RUN


def test_every_notebook_with_tagged_prose_shows_the_learner_beside_it():
    """A notebook whose prose quotes measured figures calls show_beside_reference for its lesson."""
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        tagged = any(prose_figures("".join(c["source"])) for c in cells if c["cell_type"] == "markdown")
        calls = any(f'show_beside_reference("{path.name[:2]}")' in "".join(c["source"])
                    for c in cells if c["cell_type"] == "code")
        assert calls == tagged, f"{path.name}: tagged prose {tagged}, show_beside_reference called {calls}"


def test_a_key_value_filter_picks_one_round_of_a_chain():
    recs = [Rec("15", "fix_speedup", 4.3, extra={"round": 1}), Rec("15", "fix_speedup", 1.7, extra={"round": 2})]
    assert check_markdown("bought 1.74×<!-- fig 15 fix_speedup round=2 -->", recs) == []
    assert check_markdown("bought 1.74×<!-- fig 15 fix_speedup round=1 -->", recs)          # round 1 was 4.3
    assert "no committed record" in check_markdown("bought 1.74×<!-- fig 15 fix_speedup round=9 -->", recs)[0]
    assert check_markdown("bought 1.74×<!-- fig 15 fix_speedup round -->", recs)              # unreadable option


def test_a_probes_figure_says_it_is_reference_only_and_its_script_is_committed():
    from gpulab.core.figures import PROBES, ROOT, beside
    for (lesson, name), script in PROBES.items():
        assert (ROOT / script).exists(), script
    md = ["On the H200 it ran at 795 TFLOP/s<!-- fig 00 layout_probe --> once."]
    refs = [Rec("00", "layout_probe", 795.0, source="results/x.json")]
    row, = beside("13", [], "NVIDIA H200", refs, markdown=md)
    assert row["yours"] is None and row["regime"].startswith("reference only") and "peak-probe.py" in row["regime"]


def test_a_quoted_range_narrower_than_its_records_fails():
    """Issue 40: a prose range must cover the committed records it names ("6.5-9.5x" against 6.47-17.1x)."""
    recs = [Rec("11", "tiny_ops_speedup", v) for v in (6.47, 8.0, 17.11)]
    [problem] = check_markdown("It ran 6.5–9.5×<!-- fig 11 tiny_ops_speedup --> faster.", recs)
    assert "narrower than its 3 records" in problem and "6.47..17.11" in problem
    assert check_markdown("It ran 6.5–17×<!-- fig 11 tiny_ops_speedup --> faster.", recs) == []
    assert check_markdown("It ran 9×<!-- fig 11 tiny_ops_speedup --> faster once.", recs) == []   # one figure: in range


def test_a_filter_value_with_spaces_is_quoted():
    recs = [Rec("14", "samples_per_s", 622.0, extra={"variant": "1 device, plain"}),
            Rec("14", "samples_per_s", 1120.0, extra={"variant": "DDP, 2 processes"})]
    assert check_markdown('ran 620–625 samples/s<!-- fig 14 samples_per_s variant="1 device, plain" --> here', recs) == []
    assert check_markdown("ran 620–625 samples/s<!-- fig 14 samples_per_s --> here", recs)      # both variants


def test_a_figure_whose_records_are_of_several_variants_must_name_one():
    """Issue 40 (notebook 14): a figure is one variant's; its tag names it when the records hold several."""
    recs = [Rec("14", "samples_per_s", 622.0, extra={"variant": "1 device, plain"}),
            Rec("14", "samples_per_s", 564.0, extra={"variant": "DataParallel, 2 GPU(s)"})]
    [problem] = check_markdown("ran at 622 samples/s<!-- fig 14 samples_per_s --> here", recs)
    assert "2 variants" in problem and 'variant="..."' in problem
    assert check_markdown('ran at 622 samples/s<!-- fig 14 samples_per_s variant="1 device, plain" --> here', recs) == []
    one = [Rec("14", "ddp_vs_dp", 1.4, extra={"gpus": 2})]            # no variant field: nothing to name
    assert check_markdown("ran 1.4×<!-- fig 14 ddp_vs_dp --> faster", one) == []


def test_beside_says_where_yours_ran_and_matches_only_the_figures_variant():
    """Issue 40, notebook 14 cell 46: records of gloo on CPU processes beside an H200 read "same GPU", and the
    plain step's 622 stood beside DataParallel's 564. Yours now carries its setting, a record run on the CPU is
    no GPU's reference, and a figure is matched only to a record of its references' variant."""
    from types import SimpleNamespace as R
    md = ["The plain step ran at 622 samples/s<!-- fig 14 samples_per_s variant=\"1 device, plain\" -->. "
          "DDP's overlap measured 0<!-- fig 14 ddp_overlap --> at every cap."]
    refs = [Rec("14", "samples_per_s", 622.0, extra={"variant": "1 device, plain"}, source="results/a.json"),
            Rec("14", "samples_per_s", 564.0, extra={"variant": "DataParallel, 2 GPU(s)"}, source="results/a.json"),
            Rec("14", "ddp_overlap", 0.0, extra={"backend": "nccl", "device": "cuda"}, source="results/a.json"),
            Rec("14", "ddp_overlap", 0.41, extra={"backend": "gloo", "device": "cpu"}, source="results/b.json")]
    gpu = dict(gpu="NVIDIA H200", scale="full")
    mine = [R(lesson="14", name="samples_per_s", value=630.0, extra={"variant": "1 device, plain", "backend": "nccl",
                                                                     "device": "cuda", "processes": 1, "size": "full"}, **gpu),
            R(lesson="14", name="samples_per_s", value=560.0, extra={"variant": "DataParallel, 1 GPU(s)"}, **gpu),
            R(lesson="14", name="ddp_overlap", value=0.3, extra={"backend": "gloo", "device": "cpu", "processes": 2,
                                                                 "size": "tiny"}, **gpu)]
    plain, overlap = beside("14", mine, "NVIDIA H200", refs, md)
    assert plain["yours"] == 630.0 and plain["record"] == '14/samples_per_s variant="1 device, plain"'
    assert plain["regime"] == "same GPU; yours ran with backend=nccl, device=cuda, processes=1, size=full"
    assert overlap["reference_range"] == (0.0, 0.0) and "b.json" not in overlap["reference"]   # the CPU record: none
    assert overlap["regime"].startswith("CPU processes (gloo) beside the NVIDIA H200, tiny size")
    # the newest samples_per_s is DataParallel's: it is not set beside the plain step's figure
    only_dp = beside("14", mine[1:2], "NVIDIA H200", refs, md)[0]
    assert only_dp["yours"] is None and only_dp["regime"] == (
        'none of yours is the figure\'s (variant="1 device, plain"); your newest samples_per_s ran with '
        'variant="DataParallel, 1 GPU(s)"')
    # a tag without a variant whose references hold one matches only that variant
    md_one = ["The step ran at 564 samples/s<!-- fig 14 samples_per_s --> on two GPUs."]
    row, = beside("14", mine, "NVIDIA H200", refs[1:2], md_one)
    assert row["yours"] is None and row["record"] == '14/samples_per_s variant="DataParallel, 2 GPU(s)"'


def test_yours_of_another_variant_says_the_figures_keys():
    """Issue 40, review of 10: a figure selected by extra keys that are no setting key (micro=8 steps=4) said your
    newest record 'ran with no setting recorded'; it now gives your record's values of the figure's keys."""
    from types import SimpleNamespace as R
    refs = [Rec("10", "ratio", 1.2, extra={"micro": 8, "steps": 4}, source="results/a.json")]
    md = ["Four micro-batches of 8 took 1.2×<!-- fig 10 ratio micro=8 steps=4 --> the time on the H200."]
    mine = [R(lesson="10", name="ratio", value=1.4, gpu="CPU", scale="tiny", extra={"micro": 4, "steps": 8})]
    row, = beside("10", mine, "CPU", refs, md)
    assert row["yours"] is None
    assert row["regime"] == "none of yours is the figure's (micro=8, steps=4); your newest ratio ran with micro=4, steps=8"


def test_a_renamed_measurements_old_records_are_the_same_measurement_under_its_name_now():
    """Issue 40 (review of 13, finding 6): notebook 13 records gpt_peak_fraction_ladder (its MFU as extra "mfu");
    the committed H200 runs called it gpt_mfu_ladder (MFU as "datasheet_share"). The prose tags the name now, and
    both the committed records and a learner's old ones are read under it (figures.RENAMED), so the table beside
    the prose does not say "not run yet" forever."""
    old = Rec("13", "gpt_mfu_ladder", 0.75, extra={"datasheet_share": 0.58, "batch": 32}, source="results/old.json")
    new = F.renamed(old)
    assert (new.name, new.value, new.extra) == ("gpt_peak_fraction_ladder", 0.75, {"mfu": 0.58, "batch": 32})
    assert check_markdown("reached 75 %<!-- fig 13 gpt_peak_fraction_ladder x100 --> and an MFU of "
                          "58 %<!-- fig 13 gpt_peak_fraction_ladder.mfu x100 -->.", [new]) == []
    rows = beside("13", [old], "NVIDIA H200", references=[old],
                  markdown=["58 %<!-- fig 13 gpt_peak_fraction_ladder.mfu x100 -->"])
    assert rows[0]["yours"] == pytest.approx(58.0) and rows[0]["regime"] == "same GPU"
    assert any(r.name == "gpt_peak_fraction_ladder" and r.gpu == "NVIDIA H200" for r in committed_records())


def test_a_sentence_beside_the_figure_reads_without_its_dropped_code_span():
    """A code span with a digit is dropped from a figure's sentence as `beside` returns it and the test's messages
    quote it (strip_code); the commas around it are not left behind (tenth review: "the run of 2026-12-03, , timed")."""
    md = "In this notebook's run of 2026-12-03, `results/x-2026.json`, timed on the host, pinned read 55 GB/s<!-- fig 05 h2d_gbps -->."
    shown = F.plain(F.mark_tags(md)[0])
    assert ", ," not in shown and ",," not in shown
    assert "2026-12-03, timed on the host" in shown


def test_run_picks_one_named_run_among_several_of_one_gpu():
    """Notebook 15's prose quotes one chain, of one run; two runs of the same GPU model that day differ (2026-12-07:
    round 5's promise 1.07x in the morning, 1.25x in the afternoon). `run=FOLDER` keeps only the records of the
    folder the sentence names; it filters the references, never the learner's own record."""
    from types import SimpleNamespace as R
    refs = [Rec("15", "fix_expected", 1.07, gpu="NVIDIA H100 80GB HBM3", extra={"round": 5},
                source="results/course/2026-12-07-h100-00-15/h100.json"),
            Rec("15", "fix_expected", 1.25, gpu="NVIDIA H100 80GB HBM3", extra={"round": 5},
                source="results/course/2026-12-07-h100-00-15-b/h100.json")]
    md = "promised 1.07×<!-- fig 15 fix_expected round=5 run=2026-12-07-h100-00-15-b gpu=H100 -->."
    assert check_markdown(md, refs)                                   # 1.07 is the morning's, not run b's
    assert check_markdown(md.replace("1.07", "1.25"), refs) == []
    assert check_markdown(md.replace("-b gpu", "-c gpu"), refs)       # no such run: no record
    mine = [R(lesson="15", name="fix_expected", value=1.3, gpu="NVIDIA H100 80GB HBM3", scale="full",
              extra={"round": 5})]
    row, = beside("15", mine, "NVIDIA H100 80GB HBM3", refs, [md.replace("1.07", "1.25")])
    assert row["yours"] == 1.3 and row["reference_range"] == (1.25, 1.25)


def test_a_sentence_that_names_one_gpu_cannot_quote_anothers_run():
    """A cheat found while closing issue 41's session: "On the H200 its verdict expected 1.25×" tagged with an H100
    run's folder (`run=`) and no `gpu=` passed, since the tag, not the sentence, picked the records. A sentence that
    names a GPU of the device table now needs a record of that GPU among its figure's references, or `gpu=` to say
    which GPU the figure is of."""
    refs = [Rec("15", "fix_expected", 1.25, gpu="NVIDIA H100 80GB HBM3", extra={"round": 5},
                source="results/course/2026-12-07-h100-00-15-b/x.json")]
    tag = "<!-- fig 15 fix_expected round=5 run=2026-12-07-h100-00-15-b -->"
    (problem,) = check_markdown(f"On the H200 its verdict expected 1.25×{tag}.", refs)
    assert "names the H200, its records ran on the H100" in problem
    assert check_markdown(f"On the H100 its verdict expected 1.25×{tag}.", refs) == []
    assert check_markdown(f"Its verdict expected 1.25×{tag}.", refs) == []            # no GPU named
    assert check_markdown(f"Unlike the H200, the H100 expected 1.25×{tag}.", refs) == []   # one of those named
