"""The results store: every headline measurement, kept across kernel restarts.

Introduced in notebook 00, which records this GPU's ceilings; later lessons and
the capstone read them back.

    store = results_store()
    store.record("00", "matmul_bf16", 751.2, "TFLOP/s", n=8192)
    store.latest("matmul_bf16")          # newest record for *this* GPU

The file is JSON (`GPULAB_RESULTS`, default ~/.gpulab/results.json). Every write
goes to a temporary file that replaces the old one in a single step (os.replace),
so a kernel killed mid-write leaves the previous file whole. A file that cannot
be read is never dropped silently: it is moved aside to `<name>.corrupt-<time>`,
a warning names it, and a new file starts.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator
import torch


SCHEMA = 1


class CorruptResultsWarning(UserWarning):
    """The results file could not be read; it was kept aside under another name."""


class ResultsFileError(ValueError):
    """The text is not a results store: not JSON, cut off, or JSON of another shape."""


def default_path() -> Path:
    """Where results go: $GPULAB_RESULTS, else ~/.gpulab/results.json."""
    env = os.environ.get("GPULAB_RESULTS")
    return Path(env).expanduser() if env else Path.home() / ".gpulab" / "results.json"


@dataclass(frozen=True)
class Record:
    lesson: str
    name: str
    value: float
    unit: str
    gpu: str
    device: str
    torch: str
    scale: str
    time: str
    host: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def parse_store(text: str) -> list[Any]:
    """The raw rows of a results file's text (rows may still be malformed: see `to_record`).

    ResultsFileError when the text is not a results store at all. Used by the store itself
    and by `gpulab.tools.room`, which reads learners' files without ever moving them.
    """
    try:
        data = json.loads(text)
        records = data["records"]
        if not isinstance(records, list):
            raise TypeError("'records' is not a list")
        return records
    except (ValueError, KeyError, TypeError) as err:
        raise ResultsFileError(f"{type(err).__name__}: {err}") from err


def to_record(raw: Any) -> Record | None:
    """One stored row as a Record, or None if it is malformed (not a dict, a required field
    missing, `extra` not a dict). Fields this version does not know (a newer gpulab's) are kept
    in `extra`; fields with defaults (`host`, `extra`) may be missing (an older gpulab's)."""
    if not isinstance(raw, dict):
        return None
    known = Record.__dataclass_fields__
    row = {k: v for k, v in raw.items() if k in known}
    extra = row.get("extra") or {}
    if not isinstance(extra, dict):
        return None
    row["extra"] = {**extra, **{k: v for k, v in raw.items() if k not in known}}
    try:
        return Record(**row)
    except TypeError:
        return None


def read_records(path: str | os.PathLike) -> list[Record]:
    """Every well-formed record of the results file at `path`, read only: the file is never
    moved or changed. OSError if it cannot be opened; ResultsFileError if it is not a results
    store (UnicodeDecodeError counts as that)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ResultsFileError(f"not UTF-8 text ({err.reason})") from err
    return [rec for rec in map(to_record, parse_store(text)) if rec is not None]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock beside the file while reading-modifying-writing it."""
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+") as lock:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks; writes are still atomic
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class ResultsStore:
    """A JSON list of Records at `path`."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()

    # -- reading ----------------------------------------------------------
    def _read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        try:
            return parse_store(self.path.read_text(encoding="utf-8"))
        except (ResultsFileError, UnicodeDecodeError) as err:
            stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
            n = 1
            while aside.exists():  # never overwrite an earlier copy
                n += 1
                aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            os.replace(self.path, aside)
            warnings.warn(
                f"results file {self.path} could not be read ({err}); it was kept as {aside} "
                "and a new file was started. Nothing was deleted.",
                CorruptResultsWarning, stacklevel=3)
            return []

    def records(self, lesson: str | None = None, name: str | None = None,
                gpu: str | None = None, scale: str | None = None) -> list[Record]:
        """Records matching every filter given, oldest first. Unknown keys from newer versions are kept in `extra`."""
        out = []
        for raw in self._read():
            rec = to_record(raw)
            if rec is None:
                continue  # a malformed record: skip it, keep the rest
            if ((lesson is None or rec.lesson == lesson) and (name is None or rec.name == name)
                    and (gpu is None or rec.gpu == gpu) and (scale is None or rec.scale == scale)):
                out.append(rec)
        return out

    def latest(self, name: str, lesson: str | None = None, gpu: str | None = "this",
               scale: str | None = None) -> Record | None:
        """The newest record called `name`; by default only from the GPU the course runs on now."""
        if gpu == "this":
            gpu = current_gpu_name()
        found = self.records(lesson=lesson, name=name, gpu=gpu, scale=scale)
        return found[-1] if found else None

    # -- writing ----------------------------------------------------------
    def record(self, lesson: str, name: str, value: float, unit: str, **extra: Any) -> Record:
        """Append one measurement, stamped with GPU, torch version, scale, host and time."""
        from gpulab.core.device import pick_device, scale
        value = float(value)
        rec = Record(
            lesson=str(lesson), name=name, value=value, unit=unit,
            gpu=current_gpu_name(), device=pick_device().type, torch=torch.__version__,
            scale=scale(), time=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(), extra=extra,
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path):
            rows = self._read()
            rows.append(asdict(rec))
            self._write(rows)
        return rec

    def _write(self, rows: list[dict[str, Any]]) -> None:
        payload = json.dumps({"schema": SCHEMA, "records": rows}, indent=1, default=str)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def current_gpu_name() -> str:
    """The name records are filed under: the GPU's name, or 'CPU'."""
    from gpulab.core.device import pick_device
    device = pick_device()
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def results_store(path: str | os.PathLike | None = None) -> ResultsStore:
    """The course's results store (see module docstring for where it lives)."""
    return ResultsStore(path)
