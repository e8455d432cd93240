"""gpulab.core.results: the JSON results store."""
import dataclasses
import datetime as real_dt
import json
import os
import re
import socket
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpulab.core import results
from gpulab.core.results import CorruptResultsWarning, Record, ResultsStore, results_store

FIELDS = {"lesson": "00", "name": "matmul_bf16", "value": 1.5, "unit": "TFLOP/s", "gpu": "CPU",
          "device": "cpu", "torch": "2.4.0", "scale": "tiny", "time": "2025-01-01T00:00:00+00:00"}


def write_rows(path, rows, **top):
    path.write_text(json.dumps({"schema": 1, "records": rows, **top}), encoding="utf-8")


def leftovers(directory):
    return sorted(p.name for p in Path(directory).iterdir() if p.suffix == ".tmp")


# -- where -------------------------------------------------------------------------------
def test_gpulab_results_sets_the_path(results_path):
    assert results.default_path() == results_path
    assert results_store().path == results_path


def test_path_expands_home(monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", "~/elsewhere/r.json")
    assert results.default_path() == Path.home() / "elsewhere" / "r.json"


def test_default_path_without_the_variable(monkeypatch):
    monkeypatch.delenv("GPULAB_RESULTS")
    assert results.default_path() == Path.home() / ".gpulab" / "results.json"


# -- record and read back -----------------------------------------------------------------
def test_record_stamps_the_measurement(results_path, on_cpu):
    rec = results_store().record(0, "matmul_fp32", 3, "TFLOP/s", n=256)
    assert (rec.lesson, rec.name, rec.value, rec.unit) == ("0", "matmul_fp32", 3.0, "TFLOP/s")
    assert isinstance(rec.value, float)
    assert (rec.gpu, rec.device, rec.scale) == ("CPU", "cpu", "tiny")
    assert rec.torch == torch.__version__ and rec.host == socket.gethostname()
    assert real_dt.datetime.fromisoformat(rec.time).tzinfo is not None
    assert rec.extra == {"n": 256}


def test_file_layout(results_path):
    results_store().record("00", "copy_bandwidth", 12.5, "GB/s")
    data = json.loads(results_path.read_text())
    assert data["schema"] == 1
    assert [r["name"] for r in data["records"]] == ["copy_bandwidth"]


def test_missing_file_reads_empty_and_is_not_created(results_path):
    assert results_store().records() == []
    assert results_store().latest("anything") is None
    assert not results_path.exists()


def test_record_creates_the_directory(tmp_path):
    store = ResultsStore(tmp_path / "a" / "b" / "results.json")
    store.record("00", "x", 1, "u")
    assert store.path.is_file()


def test_results_survive_a_restart(results_path):
    results_store().record("00", "matmul_fp32", 1.0, "TFLOP/s", n=64)
    results_store().record("01", "overhead", 2.0, "us")
    again = ResultsStore(results_path)             # a new kernel, a new store object
    recs = again.records()
    assert [(r.lesson, r.name, r.value) for r in recs] == [("00", "matmul_fp32", 1.0),
                                                           ("01", "overhead", 2.0)]
    assert recs[0].extra == {"n": 64}


def test_values_json_cannot_hold_are_stored_as_text(results_path):
    results_store().record("00", "x", 1.0, "u", dtype=torch.bfloat16)
    assert results_store().records()[0].extra == {"dtype": "torch.bfloat16"}


# -- filters -------------------------------------------------------------------------------
@pytest.fixture
def mixed_store(results_path):
    write_rows(results_path, [
        {**FIELDS, "lesson": "00", "name": "matmul_bf16", "value": 1.0},
        {**FIELDS, "lesson": "00", "name": "matmul_bf16", "value": 2.0, "scale": "full"},
        {**FIELDS, "lesson": "03", "name": "matmul_bf16", "value": 3.0},
        {**FIELDS, "lesson": "00", "name": "copy_bandwidth", "value": 4.0},
        {**FIELDS, "lesson": "00", "name": "matmul_bf16", "value": 5.0, "gpu": "NVIDIA H100"},
    ])
    return ResultsStore(results_path)


def test_records_filters(mixed_store):
    values = lambda **kw: [r.value for r in mixed_store.records(**kw)]  # noqa: E731
    assert values() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert values(lesson="00") == [1.0, 2.0, 4.0, 5.0]
    assert values(name="matmul_bf16") == [1.0, 2.0, 3.0, 5.0]
    assert values(name="matmul_bf16", scale="full") == [2.0]
    assert values(gpu="NVIDIA H100") == [5.0]
    assert values(lesson="00", name="matmul_bf16", gpu="CPU", scale="tiny") == [1.0]
    assert values(name="nothing") == []


def test_latest_is_the_newest_for_this_gpu(mixed_store, on_cpu):
    assert mixed_store.latest("matmul_bf16").value == 3.0            # not the H100's 5.0
    assert mixed_store.latest("matmul_bf16", lesson="00").value == 2.0
    assert mixed_store.latest("matmul_bf16", lesson="00", scale="tiny").value == 1.0
    assert mixed_store.latest("matmul_bf16", gpu=None).value == 5.0
    assert mixed_store.latest("matmul_bf16", gpu="NVIDIA H100").value == 5.0
    assert mixed_store.latest("missing") is None


# -- files from other versions ---------------------------------------------------------------
def test_unknown_keys_are_kept_in_extra(results_path):
    write_rows(results_path, [{**FIELDS, "extra": {"n": 8}, "gpu_uuid": "GPU-1", "clock": 1980}],
               schema=7)
    (rec,) = ResultsStore(results_path).records()
    assert rec.value == 1.5
    assert rec.extra == {"n": 8, "gpu_uuid": "GPU-1", "clock": 1980}
    assert rec.host == ""                                   # an old record without a host


def test_records_missing_fields_and_non_dict_rows_are_skipped(results_path):
    incomplete = {k: v for k, v in FIELDS.items() if k != "unit"}
    write_rows(results_path, [incomplete, "a string", 42, None, [1, 2], {**FIELDS, "value": 9.0}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # not treated as corrupt
        recs = ResultsStore(results_path).records()
    assert [r.value for r in recs] == [9.0]


def test_older_records_are_kept_when_a_new_one_is_added(results_path):
    write_rows(results_path, [{**FIELDS, "future_field": 1}, "junk"])
    ResultsStore(results_path).record("00", "new", 1.0, "u")
    rows = json.loads(results_path.read_text())["records"]
    assert len(rows) == 3 and rows[0]["future_field"] == 1 and rows[1] == "junk"


def test_record_with_null_extra_is_skipped_not_fatal(results_path):
    write_rows(results_path, [{**FIELDS, "extra": None}, {**FIELDS, "value": 9.0}])
    recs = ResultsStore(results_path).records()
    assert 9.0 in [r.value for r in recs]


# -- corrupt files -----------------------------------------------------------------------------
@pytest.mark.parametrize("content", [
    b'{"schema": 1, "records": [',          # cut off mid-write by an older tool
    b"[1, 2, 3]",                            # JSON, but not ours
    b'{"schema": 1, "records": {}}',         # records not a list
    b'{"schema": 1}',                        # no records
    b"\xff\xfe\x00garbage",                  # not UTF-8
])
def test_corrupt_file_is_moved_aside_not_deleted(results_path, content):
    results_path.write_bytes(content)
    store = ResultsStore(results_path)
    with pytest.warns(CorruptResultsWarning, match="could not be read") as caught:
        assert store.records() == []
    (aside,) = results_path.parent.glob("results.json.corrupt-*")
    assert re.fullmatch(r"results\.json\.corrupt-\d{8}-\d{6}", aside.name)
    assert aside.read_bytes() == content
    assert str(aside) in str(caught[0].message)
    assert not results_path.exists()
    store.record("00", "after", 1.0, "u")
    assert [r.name for r in store.records()] == ["after"]
    assert aside.read_bytes() == content


def test_record_over_a_corrupt_file_warns_and_starts_a_new_one(results_path):
    results_path.write_text("not json at all")
    with pytest.warns(CorruptResultsWarning):
        results_store().record("00", "x", 1.0, "u")
    assert [r.name for r in results_store().records()] == ["x"]
    (aside,) = results_path.parent.glob("results.json.corrupt-*")
    assert aside.read_text() == "not json at all"


def test_two_corrupt_files_in_one_second_are_both_kept(results_path, monkeypatch):
    class FrozenDatetime(real_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return real_dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=tz)
    monkeypatch.setattr(results, "dt", SimpleNamespace(datetime=FrozenDatetime,
                                                       timezone=real_dt.timezone))
    store = ResultsStore(results_path)
    for content in ("first broken file", "second broken file"):
        results_path.write_text(content)
        with pytest.warns(CorruptResultsWarning):
            store.records()
    kept = {p.read_text() for p in results_path.parent.glob("results.json.corrupt-*")}
    assert kept == {"first broken file", "second broken file"}


# -- atomic writes -----------------------------------------------------------------------------
@pytest.fixture
def one_record(results_path):
    results_store().record("00", "first", 1.0, "u")
    return results_path.read_bytes()


@pytest.mark.parametrize("target, error", [
    ("os.replace", OSError("disk vanished")),
    ("os.fsync", OSError("I/O error")),
    ("os.replace", KeyboardInterrupt()),          # the learner interrupts the kernel
    ("json.dumps", RuntimeError("crash while serialising")),
])
def test_failed_write_leaves_the_previous_file_whole(results_path, one_record, monkeypatch,
                                                     target, error):
    module, name = target.split(".")
    def crash(*a, **kw):
        raise error
    store = results_store()
    with monkeypatch.context() as m:
        m.setattr({"os": os, "json": json}[module], name, crash)
        with pytest.raises(type(error)):
            store.record("00", "second", 2.0, "u")
    assert results_path.read_bytes() == one_record
    assert [r.name for r in store.records()] == ["first"]
    assert leftovers(results_path.parent) == []


def test_concurrent_writers_lose_nothing(results_path):
    store = results_store()

    def writer(k):
        for i in range(5):
            store.record("00", f"w{k}", float(i), "u")
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recs = ResultsStore(results_path).records()
    assert len(recs) == 20
    assert sorted({r.name for r in recs}) == ["w0", "w1", "w2", "w3"]
    assert leftovers(results_path.parent) == []


def test_record_is_frozen():
    rec = Record(**FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.value = 2.0
