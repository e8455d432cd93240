"""gpulab.lessons.l02_memory_fragmentation on the CPU: refusals, the snapshot readers, the child process's errors."""
import pytest

from gpulab.lessons import l02_memory_fragmentation as frag


def test_fixes_listed():
    assert frag.FIXES == ("none", "expandable_segments", "empty_cache", "pool")


def test_unknown_fix_is_refused():
    with pytest.raises(ValueError, match="fix must be one of"):
        frag.run_in_fresh_process(fix="defrag")
    with pytest.raises(ValueError, match="fix must be one of"):
        frag.run_pattern(fix="defrag")


def test_without_cuda_it_says_why(on_cpu):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        frag.run_in_fresh_process(cap_mib=1024)


def test_the_child_process_refuses_without_cuda(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert frag.main(["--cap-mib", "1024"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_layout_of_a_snapshot():
    MiB = 2**20
    segments = [
        {"blocks": [{"size": 24 * MiB, "state": "active_allocated"}, {"size": 16 * MiB, "state": "inactive"}]},
        {"blocks": [{"size": 40 * MiB, "state": "inactive"}]},
    ]
    layout, largest, n = frag.layout_of(segments)
    assert n == 2
    assert layout == [[(24.0, "live"), (16.0, "free")], [(40.0, "free")]]
    assert largest == 40.0


def test_trace_timeline_counts_allocs_and_completed_frees():
    MiB = 2**20
    snap = {"device_traces": [[
        {"action": "alloc", "size": 40 * MiB},
        {"action": "alloc", "size": 24 * MiB},
        {"action": "free_requested", "size": 40 * MiB},   # not yet free: ignored
        {"action": "free_completed", "size": 40 * MiB},
        {"action": "segment_alloc", "size": 40 * MiB},    # segments are not tensors: ignored
    ]]}
    assert frag.trace_timeline(snap) == [40.0, 64.0, 24.0]
    assert frag.trace_timeline({}) == []


@pytest.mark.gpu
def test_the_pattern_ooms_without_a_fix_and_fits_with_each():
    plain = frag.run_in_fresh_process(cap_mib=1024, fix="none")
    assert not plain.ok and plain.free_in_cap_mib > plain.big_mib
    assert plain.largest_free_block_mib < plain.big_mib
    fixed = frag.run_in_fresh_processes(("expandable_segments", "empty_cache", "pool"), cap_mib=1024)
    assert all(res.ok for res in fixed.values()), fixed      # three processes at once, each under its own cap


def test_several_fixes_refuse_an_unknown_one_before_starting_anything():
    with pytest.raises(ValueError, match="fix must be one of"):
        frag.run_in_fresh_processes(["none", "defrag"])


def test_children_start_together_only_where_the_free_memory_holds_them_all():
    """Issue 40: three children at once, each reserving up to its cap (4096 MiB) beside its CUDA context, ran an
    8-12 GB card out of memory in phase A. They start together only where count x (cap + context) is free."""
    ok, why = frag.fit_together(3, 4096, 140_000)
    assert ok and "started together" in why and "15,360 MiB" in why
    ok, why = frag.fit_together(3, 4096, 11_000)             # a 12 GB card
    assert not ok and "one after another" in why and "11,000 MiB free" in why
    assert not frag.fit_together(3, 4096, None)[0]            # free memory unknown: one after another
    assert frag.fit_together(1, 4096, 10)[0]                  # one process is always run


def test_children_that_do_not_fit_run_one_after_another(monkeypatch):
    """Where they do not fit, each child is started alone, and every one runs even where an earlier one fails."""
    calls = []

    class Failed:
        returncode, stdout, stderr = 1, "", "stopped by the test"

    def at_once(commands, timeout_s):
        calls.append(list(commands))
        return {k: Failed() for k in commands}
    monkeypatch.setattr(frag, "at_once", at_once)
    monkeypatch.setattr(frag, "require_cuda", lambda why: None)
    monkeypatch.setattr(frag, "free_memory", lambda: (8 * 2**30, 8 * 2**30))       # an 8 GiB card, all free
    with pytest.raises(RuntimeError, match="stopped by the test"):
        frag.run_in_fresh_processes(["expandable_segments", "empty_cache", "pool"], cap_mib=4096)
    assert calls == [["expandable_segments"], ["empty_cache"], ["pool"]]
    calls.clear()
    monkeypatch.setattr(frag, "free_memory", lambda: (140 * 2**30, 141 * 2**30))    # an H200
    with pytest.raises(RuntimeError):
        frag.run_in_fresh_processes(["expandable_segments", "empty_cache", "pool"], cap_mib=4096)
    assert calls == [["expandable_segments", "empty_cache", "pool"]]
