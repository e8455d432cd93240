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


# -- a store that cannot be used where it is (issue 16) ----------------------------------------
def locks(directory):
    return sorted(p.name for p in Path(directory).rglob("*.lock"))


def test_no_lock_file_is_left_behind(results_path):
    results_store().record("00", "x", 1.0, "u")
    results_store().record("00", "y", 2.0, "u")
    assert locks(results_path.parent) == []
    assert [r.name for r in results_store().records()] == ["x", "y"]


def test_a_folder_as_the_path_is_a_clear_error_for_readers(tmp_path):
    folder = tmp_path / "results.json"
    folder.mkdir()
    with pytest.raises(results.ResultsFileError, match="is a folder, not a results file"):
        results.read_records(folder)


def test_a_folder_as_the_store_warns_once_and_the_lesson_goes_on(tmp_path):
    folder = tmp_path / "store"
    folder.mkdir()
    store = ResultsStore(folder)
    with pytest.warns(results.UnusableResultsWarning) as caught:
        assert store.records() == []
        rec = store.record("00", "matmul_fp32", 2.5, "TFLOP/s")
        assert store.latest("matmul_fp32") is None
    assert (rec.name, rec.value) == ("matmul_fp32", 2.5)        # the measurement is still returned
    assert len(caught) == 1                                       # once, not once per call
    message = str(caught[0].message)
    assert str(folder) in message and "is a folder, not a file" in message
    assert "GPULAB_RESULTS" in message and "nothing is recorded" in message
    assert list(folder.iterdir()) == []                           # no lock, no temporary file


def test_a_path_under_a_file_warns_once_and_creates_nothing(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where a folder should be")
    store = ResultsStore(blocker / "sub" / "results.json")
    with pytest.warns(results.UnusableResultsWarning, match="is a file, not a folder") as caught:
        for i in range(5):                                        # notebook 00 records five times
            store.record("00", f"m{i}", float(i), "u")
        assert store.records() == []
    assert len(caught) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]


@pytest.mark.parametrize("target, error", [
    ("tempfile.mkstemp", PermissionError(13, "Permission denied")),       # a read-only folder
    ("os.replace", PermissionError(13, "Permission denied")),
    ("tempfile.mkstemp", OSError(30, "Read-only file system")),
    ("os.replace", OSError(28, "No space left on device")),
])
def test_a_store_that_cannot_be_written_warns_once_and_leaves_nothing(results_path, one_record, monkeypatch,
                                                                     target, error):
    module, name = target.split(".")
    def refuse(*a, **kw):
        raise error
    store = results_store()
    monkeypatch.setattr({"os": os, "tempfile": results.tempfile}[module], name, refuse)
    with pytest.warns(results.UnusableResultsWarning, match="cannot be written") as caught:
        rec = store.record("00", "second", 2.0, "u")
        store.record("00", "third", 3.0, "u")
        assert [r.name for r in store.records()] == ["first"]         # what it holds is still read
    monkeypatch.undo()
    assert rec.value == 2.0 and len(caught) == 1
    assert "nothing new is recorded" in str(caught[0].message)
    assert error.strerror in str(caught[0].message) and str(results_path) in str(caught[0].message)
    assert results_path.read_bytes() == one_record                     # the old file is whole
    assert leftovers(results_path.parent) == [] and locks(results_path.parent) == []


def test_a_store_that_cannot_be_read_is_never_overwritten(results_path, one_record, monkeypatch):
    real = Path.read_text
    def refuse(self, *a, **kw):
        if self == results_path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)
    monkeypatch.setattr(Path, "read_text", refuse)
    store = results_store()
    with pytest.warns(results.UnusableResultsWarning, match="cannot be read") as caught:
        assert store.records() == []
        store.record("00", "second", 2.0, "u")
    monkeypatch.undo()
    assert len(caught) == 1
    assert results_path.read_bytes() == one_record
    assert locks(results_path.parent) == []


def test_a_usable_store_does_not_warn(results_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results_store().record("00", "x", 1.0, "u")
        assert len(results_store().records()) == 1


# -- values must be finite real numbers (issue 16) ---------------------------------------------
@pytest.mark.parametrize("value", ["abc", "1.5", True, False, None, float("nan"), float("inf"),
                                   -float("inf"), 1j, [1.0], {"v": 1}])
def test_record_refuses_a_value_that_is_not_a_finite_real_number(results_path, value):
    with pytest.raises(ValueError, match="finite real number"):
        results_store().record("00", "matmul_fp32", value, "TFLOP/s")
    assert not results_path.exists()


@pytest.mark.parametrize("value, stored", [(3, 3.0), (0, 0.0), (-1.5, -1.5), (torch.tensor(2.5), 2.5),
                                           (torch.tensor(4), 4.0)])
def test_record_accepts_real_numbers_of_any_type(results_path, value, stored):
    rec = results_store().record("00", "x", value, "u")
    assert rec.value == stored and type(rec.value) is float
    assert results_store().records()[0].value == stored


def test_reading_skips_records_with_invalid_values_with_one_note(results_path):
    write_rows(results_path, [{**FIELDS, "value": v}                 # json writes NaN and Infinity as such
                              for v in ("abc", None, True, float("nan"), 7, float("inf"))])
    store = ResultsStore(results_path)
    with pytest.warns(results.InvalidRecordsWarning) as caught:
        assert [r.value for r in store.records()] == [7.0]
        assert store.latest("matmul_bf16", gpu=None).value == 7.0
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "5 record(s)" in message and str(results_path) in message and "'abc'" in message
    assert results.to_record({**FIELDS, "value": "abc"}) is None
    assert results.to_record({**FIELDS, "value": True}) is None
    assert results.to_record({**FIELDS, "value": 2}).value == 2.0
    assert len(json.loads(results_path.read_text())["records"]) == 6    # the file is left as it is


# -- ceilings never use a zero or negative measurement (issue 16) --------------------------------
def test_ceilings_skip_zero_and_negative_measurements(results_path, on_cpu):
    from gpulab.core.ceilings import ceilings
    write_rows(results_path, [
        {**FIELDS, "name": "matmul_fp32", "value": 10.0, "scale": "full"},
        {**FIELDS, "name": "matmul_fp32", "value": 0.0, "scale": "full"},       # newest, but no ceiling
        {**FIELDS, "name": "copy_bandwidth", "value": -3.0},
        {**FIELDS, "name": "matmul_bf16", "value": 0.0},
        {**FIELDS, "name": "matmul_fp16", "value": 4.0, "scale": "full"},
        {**FIELDS, "name": "matmul_fp16", "value": 5.0},                        # tiny: full size wins
    ])
    found = ceilings(ResultsStore(results_path))
    assert found["matmul_fp32"].value == 10.0
    assert found["matmul_fp16"].value == 4.0
    assert "copy_bandwidth" not in found and "matmul_bf16" not in found        # no datasheet on the CPU
    assert all(c.value > 0 for c in found.values())


def test_a_workshop_room_gives_each_learner_a_file_in_the_room(monkeypatch, tmp_path):
    from gpulab.core.results import default_path
    monkeypatch.delenv("GPULAB_RESULTS", raising=False)
    monkeypatch.delenv("GPULAB_LEARNER", raising=False)
    monkeypatch.setenv("GPULAB_ROOM", str(tmp_path))
    monkeypatch.setenv("JUPYTERHUB_USER", "ann/../x")
    assert default_path() == tmp_path / "ann_.._x.json"          # one file in the room, never outside it
    monkeypatch.setenv("GPULAB_LEARNER", "bob")
    assert default_path() == tmp_path / "bob.json"
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "mine.json"))
    assert default_path() == tmp_path / "mine.json"
