"""gpulab.lessons.l03_input_pipeline: the CPU-heavy dataset, the loader settings and the timed loop (CPU only)."""
import pytest
import torch

from gpulab.lessons.l03_input_pipeline import LoopResult, SyntheticImages, live_workers, make_loader, make_step, train_from_loader, window_mean
from gpulab.models.cnn import SmallCNN, conv_flops


def test_samples_depend_only_on_index_and_seed():
    a = SyntheticImages(8, size=16, passes=2, seed=3)
    b = SyntheticImages(8, size=16, passes=2, seed=3)
    x, y = a[5]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and x.is_contiguous()
    assert 0 <= y < 10
    assert torch.equal(x, b[5][0]) and y == b[5][1]
    assert not torch.equal(x, a[4][0])
    assert not torch.equal(x, SyntheticImages(8, size=16, passes=2, seed=4)[5][0])


def test_passes_change_the_image_and_bad_arguments_are_refused():
    assert not torch.equal(SyntheticImages(2, size=8, passes=0)[0][0], SyntheticImages(2, size=8, passes=3)[0][0])
    with pytest.raises(IndexError):
        SyntheticImages(2, size=8)[2]
    with pytest.raises(ValueError):
        SyntheticImages(0)
    with pytest.raises(ValueError):
        SyntheticImages(4, passes=-1)


def test_workers_give_the_same_batches_and_exit():
    ds = SyntheticImages(12, size=8, passes=1)
    ref = list(make_loader(ds, 4, num_workers=0))
    par = list(make_loader(ds, 4, num_workers=2, prefetch_factor=1))
    assert len(ref) == len(par) == 3
    for (xa, ya), (xb, yb) in zip(ref, par):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert live_workers() == 0


def test_make_loader_refusals():
    ds = SyntheticImages(4, size=8)
    with pytest.raises(ValueError, match="num_workers"):
        make_loader(ds, 2, num_workers=-1)
    with pytest.raises(ValueError, match="prefetch_factor"):
        make_loader(ds, 2, num_workers=1, prefetch_factor=0)
    assert make_loader(ds, 2, num_workers=0, prefetch_factor=4).prefetch_factor is None
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            make_loader(ds, 2, pin_memory=True)


def test_train_from_loader_times_the_steps_after_warmup():
    torch.manual_seed(0)
    model = SmallCNN(width=4, blocks=2)
    step = make_step(model)
    loader = make_loader(SyntheticImages(5 * 4, size=16, passes=1), 4, num_workers=1)
    r = train_from_loader(loader, step, warmup=2, device=torch.device("cpu"))
    assert isinstance(r, LoopResult)
    assert r.steps == 3 and r.batch_size == 4 and r.num_workers == 1 and r.prefetch_factor == 2
    assert r.step_ms > 0 and r.host_wait_ms >= 0 and r.end_s > r.start_s
    assert r.images_per_s == pytest.approx(4 / (r.step_ms / 1e3))
    assert len(r.losses) == 5
    assert len(r.waits_ms) == 3 and sum(r.waits_ms) / 3 == pytest.approx(r.host_wait_ms)
    assert 0 <= r.wait_share <= 1      # the waits lie inside the timed loop
    assert live_workers() == 0
    with pytest.raises(ValueError, match="warmup"):
        train_from_loader(make_loader(SyntheticImages(4, size=16), 4), step, warmup=1,
                          device=torch.device("cpu"))


def test_small_cnn_shapes_and_flops():
    m = SmallCNN(width=4, blocks=3, classes=7)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    # stage 1 at 32x32: 3->4, 4->4; stage 2 at 16x16: 4->8, 8->8; stage 3 at 8x8: 8->16, 16->16
    macs = 32 * 32 * (3 * 4 + 4 * 4) + 16 * 16 * (4 * 8 + 8 * 8) + 8 * 8 * (8 * 16 + 16 * 16)
    assert conv_flops(m, 2, 32) == 2 * 2 * 9 * macs


def test_window_mean():
    tl = {"t_s": [0.0, 0.5, 1.0, 1.5], "busy_pct": [10.0, None, 30.0, 50.0]}
    assert window_mean(tl, 0.0, 1.0) == pytest.approx(20.0)
    assert window_mean(tl, 2.0, 3.0) is None
    assert window_mean({}, 0, 1) is None


def test_calibrate_passes():
    from gpulab.lessons.l03_input_pipeline import calibrate_passes
    few, many = calibrate_passes(16, 0.05), calibrate_passes(16, 0.5)
    assert 1 <= few <= many <= 200
    with pytest.raises(ValueError):
        calibrate_passes(16, 0)


def test_batches_match_and_loader_run_on_the_cpu():
    from gpulab.models.cnn import SmallCNN
    from gpulab.lessons.l03_input_pipeline import SyntheticImages, batches_match, loader_run, make_step
    same, n = batches_match(SyntheticImages(length=12, size=16, passes=1), 4, num_workers=2)
    assert same and n == 3
    torch.manual_seed(0)
    step = make_step(SmallCNN(width=4, blocks=1, device=torch.device("cpu")))
    r = loader_run(step, 0, batch=4, size=16, passes=1, steps=3, warmup=1, device=torch.device("cpu"))
    assert r.steps == 3 and r.batch_size == 4 and len(r.losses) == 4 and r.step_ms > 0


def test_size_model_resizes_nothing_on_the_cpu_or_at_tiny_scale():
    import torch
    from gpulab.lessons.l03_input_pipeline import config, size_model
    assert size_model(config("full"), torch.device("cpu"), data_ms=100.0) == (config("full")["width"], None)
    assert size_model(config("tiny"), torch.device("cpu"), data_ms=1.0) == (config("tiny")["width"], None)


def test_full_config_asks_for_a_stall_and_a_floor_width():
    from gpulab.lessons.l03_input_pipeline import config
    cfg = config("full")
    assert cfg["stall"] > 1 and 8 <= cfg["min_width"] <= cfg["width"]


def test_the_worker_floor_follows_the_cores_this_host_has():
    """Issue 24: a Colab T4 has 2 vCPUs; the band's >= 2 came from a 16-core host."""
    from gpulab.lessons.l03_input_pipeline import WORKER_FLOOR_SHARE, usable_workers, worker_speedup_floor
    workers = (0, 2, 4, 8, 12)
    low16, _ = worker_speedup_floor(usable_workers(workers, 16), cores=16, stall=8)
    low2, why2 = worker_speedup_floor(usable_workers(workers, 2), cores=2, stall=8)
    assert low16 == WORKER_FLOOR_SHARE * 8 and low16 >= 2.0           # the band's own low end stays
    assert low2 == WORKER_FLOOR_SHARE * 2 and "2 physical CPU core(s)" in why2  # a 2-core host: 1.5
    assert worker_speedup_floor([0], cores=1)[0] == WORKER_FLOOR_SHARE  # no worker at all


def test_expect_band_lowers_its_low_end_to_a_lower_prediction_and_says_so(capsys, monkeypatch):
    import gpulab.core.bands as B
    from gpulab.notebook import lesson
    band = B.Band(gpu_class="tensor-core", lesson="03", metric="m", low=2.0, high=20.0, source="s")
    monkeypatch.setattr(B, "gpu_class", lambda facts=None: "tensor-core")
    monkeypatch.setattr(B, "load_bands", lambda: type("Bands", (), {"band": lambda self, cls, lesson: band})())
    import gpulab.lessons.l03_input_pipeline as L03
    monkeypatch.setattr(L03, "band_floor", lambda scale=None: (1.5, "2 CPU core(s)"))
    check = lesson.expect_band("03", 1.6)
    out = capsys.readouterr().out
    assert check.status == "pass" and check.low == 1.5 and "lowered from 2: 2 CPU core(s)" in out
    monkeypatch.setattr(L03, "band_floor", lambda scale=None: (6.0, "16 cores"))
    assert lesson.expect_band("03", 1.6).status == "FAIL"                                   # never raised
    monkeypatch.delattr(L03, "band_floor")
    assert lesson.expect_band("03", 1.6).status == "FAIL"


def test_on_one_physical_core_the_worker_check_is_skipped_not_passed(monkeypatch):
    """Seventh review of issue 40: with one physical core the floor fell to 0.75, under the 1.0 that the best of
    settings including 0 workers always reaches, so the check could not fail. It is skipped, with the reason,
    in the notebook and in bench (one rule: `bands.judged_low`)."""
    import gpulab.core.bands as B
    import gpulab.lessons.l03_input_pipeline as L03
    from gpulab.notebook import lesson
    monkeypatch.setattr(L03, "physical_cores", lambda: 1)
    monkeypatch.setattr(L03, "cpu_cores", lambda: 2)
    floor, why = L03.band_floor("full")
    assert floor is None and "1 physical CPU core(s)" in why and "not judged" in why
    band = B.Band(gpu_class="tensor-core", lesson="03", metric="m", low=2.0, high=20.0, source="s")
    low, reason = B.judged_low(band, L03)
    assert low is None and "no core of their own" in reason
    monkeypatch.setattr(B, "gpu_class", lambda facts=None: "tensor-core")
    monkeypatch.setattr(B, "load_bands", lambda: type("Bands", (), {"band": lambda self, cls, lesson: band})())
    check = lesson.expect_band("03", 1.0)
    assert check.status == "skipped" and "no core of their own" in check.why
    monkeypatch.setattr(L03, "physical_cores", lambda: 2)                   # two cores: judged again
    assert L03.band_floor("full")[0] == L03.WORKER_FLOOR_SHARE * 2


def test_headline_runs_the_configuration_it_is_given(monkeypatch):
    """Notebook 03's self-check passes section 1's passes and section 2's width (issue 40: recalibrated, the
    headline once ran 5 passes where the table had used 10): given them, it neither recalibrates nor resizes."""
    from types import SimpleNamespace
    import gpulab.lessons.l03_input_pipeline as L03
    monkeypatch.setattr(L03, "calibrate_passes", lambda *a, **k: pytest.fail("headline recalibrated the passes"))
    monkeypatch.setattr(L03, "size_model", lambda *a, **k: pytest.fail("headline resized the model"))
    ran = []

    def fake_run(step, k, *, passes, **kw):
        ran.append((k, passes))
        return SimpleNamespace(step_ms=10.0 / (1 + k))

    monkeypatch.setattr(L03, "loader_run", fake_run)
    monkeypatch.setattr(L03, "batches_match", lambda ds, batch, num_workers: (ds.passes == 7, 3))
    m = L03.headline("tiny", passes=7, width=8)
    assert ran and {p for _, p in ran} == {7}, ran
    assert m.correct and "7 passes, width 8" in m.baseline_label, m.baseline_label
    with pytest.raises(ValueError, match="passes >= 0"):
        L03.headline("tiny", passes=-1, width=8)


def test_the_busy_check_follows_section_3s_prediction_and_passes_every_committed_run():
    """Issue 40: the busy check's low end was a constant 1.5. It is now BUSY_PREDICTION_SHARE of section 3's prediction
    (busy = compute / step: the two settings' step ratio). Every committed full-size run (ten on the H200) passes it."""
    from collections import defaultdict

    from gpulab.core.figures import Tag, committed_records, reference_records
    from gpulab.lessons.l03_input_pipeline import BUSY_PREDICTION_SHARE, busy_ratio_floor
    low, why = busy_ratio_floor(120.0, 12.0)
    assert low == pytest.approx(BUSY_PREDICTION_SHARE * 10) and "120.0 / 12.0 ms" in why
    runs = defaultdict(dict)
    for name in ("step_ms_0_workers", "step_ms_12_workers"):
        for r in reference_records(Tag("03", name), committed_records()):
            runs[r.time[:13]][name] = r          # one run's records share the hour they were made in
    judged = 0
    for recs in runs.values():
        r0, r12 = recs.get("step_ms_0_workers"), recs.get("step_ms_12_workers")
        if r0 and r12 and r0.extra.get("gpu_busy_pct") and r12.extra.get("gpu_busy_pct"):
            low, _ = busy_ratio_floor(r0.value, r12.value)
            assert r12.extra["gpu_busy_pct"] / r0.extra["gpu_busy_pct"] >= low, (r0.source, low)
            judged += 1
    assert judged >= 5
