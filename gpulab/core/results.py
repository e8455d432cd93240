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

A store the course cannot use where it is (a folder, a read-only folder or file system, a
path under a file, a full disk) never stops a lesson: one `UnusableResultsWarning` says so
and how to fix it, the measurements still run and are returned, nothing is recorded. Every
value is a finite real number (`record` refuses anything else); records in a file that break
this rule are skipped on reading, with one `InvalidRecordsWarning`, never handed to lessons.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import math
import os
import socket
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator
import torch


SCHEMA = 1

# What a JSON file in a results or room folder says it is (its "kind"): the one table. A results store has no kind
# (it has "records"); each tool writes its own kind from here, and `gpulab room` reads the table to tell them apart.
FILE_KINDS = {
    "bench": "gpulab-bench",                        # `gpulab bench --json`: measurements, read by the room
    "manifest": "gpulab results manifest",          # a run folder's manifest (tools.results_index): what ran
    "roomrun": "gpulab roomrun",                    # roomrun's timings, exit codes, summary ("gpulab roomrun ...")
    "zoo": "gpulab zoo",                            # the diagnosis zoo's labels, diagnoses, judgements ("gpulab zoo ...")
    "suite": "gpulab diagnose suite",               # `python -m gpulab.diagnose.suite --json`
    "proof": "gpulab exercises proof",              # `python -m gpulab.exercises.proof`: the graded exercises' verdicts
    "answers": "gpulab exercises answers",          # `python -m gpulab.exercises.answers`: the reference answers' runs
}


class CorruptResultsWarning(UserWarning):
    """The results file could not be read; it was kept aside under another name."""


class ResultsFileError(ValueError):
    """The text is not a results store: not JSON, cut off, or JSON of another shape."""


class UnusableResultsWarning(UserWarning):
    """The results store cannot be read or written where it is; lessons run on without it."""


class InvalidRecordsWarning(UserWarning):
    """Records whose value is not a finite real number were skipped (the file is left as it is)."""


# OSErrors that say "not here": the store's location cannot be used. Anything else (an I/O
# error, an interrupted write) is raised as before.
_LOCATION_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR, errno.ENOSPC,
                    getattr(errno, "EDQUOT", errno.ENOSPC)}

_warned: set[tuple[str, ...]] = set()     # warnings already given in this process: each is given once


def _warn_once(key: tuple[str, ...], message: str, category: type[Warning], stacklevel: int = 4) -> None:
    """Warn unless this warning was given before; `stacklevel` counts from the caller of _warn_once."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, category, stacklevel=stacklevel)


class _Unusable(Exception):
    """Internal: the store's location cannot be used, for the reason given."""


def _location_problem(path: Path) -> str | None:
    """Why no results file can live at `path` at all (a folder, or under a file), or None."""
    if path.is_dir():
        return "it is a folder, not a file"
    for parent in path.parents:                      # nearest first: the first one that exists
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is a file, not a folder"
    return None


def finite_value(value: Any) -> float | None:
    """`value` as a float if it is a finite real number (an int, a float, a NumPy or one-element
    torch number); None for anything else: text (even "1.5"), bool, None, NaN, inf, complex."""
    if isinstance(value, (bool, str, bytes, complex)) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, torch.Tensor) and (value.numel() != 1 or value.is_complex()
                                            or value.dtype == torch.bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None
    return v if math.isfinite(v) else None


def default_path() -> Path:
    """Where results go: $GPULAB_RESULTS; else, in a workshop room, $GPULAB_ROOM/<learner>.json (the learner
    from $GPULAB_LEARNER or JupyterHub's $JUPYTERHUB_USER: one file each in the folder the instructor
    watches); else ~/.gpulab/results.json."""
    env = os.environ.get("GPULAB_RESULTS")
    if env:
        return Path(env).expanduser()
    room = os.environ.get("GPULAB_ROOM")
    learner = os.environ.get("GPULAB_LEARNER") or os.environ.get("JUPYTERHUB_USER")
    if room and learner:
        return Path(room).expanduser() / room_file(learner)
    return Path.home() / ".gpulab" / "results.json"


def room_file(learner: str) -> str:
    """A learner's results file name in a room folder: their name with anything but letters, digits and
    -_. replaced, so it stays one file inside the room."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in learner) + ".json"


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


def _bad_value(raw: Any) -> bool:
    """True for a row that has a `value`, but not a finite real number."""
    return isinstance(raw, dict) and "value" in raw and finite_value(raw["value"]) is None


def to_record(raw: Any) -> Record | None:
    """One stored row as a Record, or None if it is malformed (not a dict, a required field
    missing, `extra` not a dict, `value` not a finite real number). Fields this version does not
    know (a newer gpulab's) are kept in `extra`; fields with defaults (`host`, `extra`) may be
    missing (an older gpulab's)."""
    if not isinstance(raw, dict) or _bad_value(raw):
        return None
    known = Record.__dataclass_fields__
    row = {k: v for k, v in raw.items() if k in known}
    if "value" in row:
        row["value"] = finite_value(row["value"])
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
    store (UnicodeDecodeError and a folder count as that)."""
    if Path(path).is_dir():
        raise ResultsFileError(f"{path} is a folder, not a results file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ResultsFileError(f"not UTF-8 text ({err.reason})") from err
    return [rec for rec in map(to_record, parse_store(text)) if rec is not None]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock beside the file while reading-modifying-writing it.

    The lock file (`<name>.lock`) exists only while it is held: its holder removes it before
    letting go, and a writer that was waiting on the removed file takes the lock again on the
    file now at that path (checked by inode), so two writers never both think they hold it.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; writes are still atomic
        yield
        return
    lock_path = path.with_name(path.name + ".lock")
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(lock_path))
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)                  # its holder removed it while we waited: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        os.close(fd)                  # closing lets go of the lock


class ResultsStore:
    """A JSON list of Records at `path`."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.problem: str | None = None   # why this store could not be used, once that happened

    # -- reading ----------------------------------------------------------
    def _read(self) -> list[Any]:
        """The raw rows; [] without a file. A file that is not a results store is moved aside
        (CorruptResultsWarning). _Unusable when the location cannot be used."""
        problem = _location_problem(self.path)
        if problem:
            raise _Unusable(problem)
        if not self.path.exists():
            return []
        try:
            return parse_store(self.path.read_text(encoding="utf-8"))
        except OSError as err:
            if err.errno in _LOCATION_ERRNOS:
                raise _Unusable(f"it cannot be read ({err.strerror})") from err
            raise
        except (ResultsFileError, UnicodeDecodeError) as err:
            stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
            n = 1
            while aside.exists():  # never overwrite an earlier copy
                n += 1
                aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            try:
                os.replace(self.path, aside)
            except OSError as move_err:
                if move_err.errno in _LOCATION_ERRNOS:
                    raise _Unusable(f"it could not be read ({err}) and cannot be set aside "
                                    f"({move_err.strerror})") from err
                raise
            warnings.warn(
                f"results file {self.path} could not be read ({err}); it was kept as {aside} "
                "and a new file was started. Nothing was deleted.",
                CorruptResultsWarning, stacklevel=3)
            return []

    def _unusable(self, why: _Unusable) -> None:
        self.problem = str(why)
        written_only = str(why).startswith("it cannot be written")
        _warn_once(("unusable", str(self.path), str(why)),
                   f"gpulab cannot use the results store {self.path}: {why}. The lessons run on, but "
                   + ("nothing new is recorded (what the file already holds is still read). " if written_only
                      else "nothing is recorded and nothing is read back from it. ")
                   + "Set GPULAB_RESULTS to a file in a folder you can write (e.g. "
                   "GPULAB_RESULTS=~/gpulab-results.json), then restart the kernel.", UnusableResultsWarning)

    def records(self, lesson: str | None = None, name: str | None = None,
                gpu: str | None = None, scale: str | None = None) -> list[Record]:
        """Records matching every filter given, oldest first. Unknown keys from newer versions are kept in `extra`.

        Records whose value is not a finite real number are skipped (one InvalidRecordsWarning);
        a store that cannot be used gives [] (one UnusableResultsWarning)."""
        try:
            rows = self._read()
        except _Unusable as why:
            self._unusable(why)
            return []
        bad = [raw for raw in rows if _bad_value(raw)]
        if bad:
            shown = ", ".join(f"{raw.get('name', '?')!s}={raw['value']!r}" for raw in bad[:3])
            _warn_once(("invalid", str(self.path), str(len(bad))),
                       f"results store {self.path}: {len(bad)} record(s) skipped because their value is "
                       f"not a finite real number ({shown}{', ...' if len(bad) > 3 else ''}); "
                       "the file is left as it is.", InvalidRecordsWarning, stacklevel=3)
        out = []
        for raw in rows:
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
    def record(self, lesson: str, name: str, value: float, unit: str, *, scale: str | None = None,
               **extra: Any) -> Record:
        """Append one measurement, stamped with GPU, torch version, scale, host and time (and, measured
        on a shared GPU, `extra["shared"]`: a MIG slice or other processes on it, `monitor.sharing_mark`;
        under a GPU profile, `extra["profile"]`: its timings are this GPU's, its code paths the profile's).

        `value` must be a finite real number (ValueError otherwise). `scale` is the scale the
        measurement ran at (default: the course's, `GPULAB_SCALE`). Where the store cannot be
        written, one UnusableResultsWarning says why, and the record is returned unsaved.
        """
        from gpulab.core.device import pick_device, resolve_scale
        from gpulab.core.monitor import sharing_mark
        from gpulab.core.profiles import active_profile
        checked = finite_value(value)
        if checked is None:
            raise ValueError(f"{name}: a recorded value must be a finite real number, got {value!r}.")
        rec = Record(
            lesson=str(lesson), name=name, value=checked, unit=unit,
            gpu=current_gpu_name(), device=pick_device().type, torch=torch.__version__,
            scale=resolve_scale(scale), time=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(), extra={**extra, **sharing_mark(), **profile_mark(active_profile())},
        )
        try:
            problem = _location_problem(self.path)
            if problem:
                raise _Unusable(problem)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with _locked(self.path):
                    rows = self._read()
                    rows.append(asdict(rec))
                    self._write(rows)
            except OSError as err:
                if err.errno not in _LOCATION_ERRNOS:
                    raise
                raise _Unusable(f"it cannot be written ({err.strerror})") from err
        except _Unusable as why:
            self._unusable(why)
        return rec

    def _write(self, rows: list[dict[str, Any]]) -> None:
        payload = json.dumps({"schema": SCHEMA, "records": rows}, indent=1, default=str)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            # readable by others, as a file written with open() under the usual umask would be (mkstemp
            # makes 0600): an instructor reads learners' stores in a workshop's room folder
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o644 & ~umask)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def profile_mark(profile) -> dict:
    """{"profile": its key} for a record made under a GPU profile, else {}."""
    return {"profile": profile.key} if profile is not None else {}


def record_profile(record: Record) -> str | None:
    """The GPU profile a record was made under (None: this GPU as it is)."""
    value = record.extra.get("profile")
    return value if isinstance(value, str) and value else None


def current_gpu_name() -> str:
    """The name records are filed under: the GPU's name, or 'CPU'."""
    from gpulab.core.device import pick_device
    device = pick_device()
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def results_store(path: str | os.PathLike | None = None) -> ResultsStore:
    """The course's results store (see module docstring for where it lives)."""
    return ResultsStore(path)
