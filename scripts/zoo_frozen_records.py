"""Records of the zoo's live diagnoses analysed by an older gpulab (the "before" of a rule change).

    git worktree add /tmp/frozen 822f1d6
    PYTHONPATH=/tmp/frozen python scripts/zoo_frozen_records.py RECORDS --confirmations D --out OUT

runs the older checkout's own `zoo.py records` (its rules, its `from_record`, its `with_confirmations`) on records
that a newer gpulab wrote. A newer record may carry an input of `analyze` that the older one does not take (at
822f1d6: `tf32_supported`, which only withholds TF32 advice before Ampere; and the stall fact `every_chunk`): such
inputs are dropped, and said, so the older rules read the profile exactly as they would have. Nothing else is
changed.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path


def tolerant(fn, dropped: set, prefix: str = ""):
    """`fn` called with only the keyword arguments it takes; the others' names go into `dropped`."""
    known = set(inspect.signature(fn).parameters)

    def call(*args, **kwargs):
        extra = set(kwargs) - known
        dropped.update(prefix + k for k in extra)
        return fn(*args, **{k: v for k, v in kwargs.items() if k not in extra})
    return call


def gzipped(argv: list[str]) -> list[str]:
    """argv with its records folder (the first argument) as gzipped JSON, the only kind an older gpulab reads: where
    it holds xz records (`core.open_record`), a temporary folder of gzipped copies of every record in it."""
    import gzip
    import lzma
    import shutil
    import tempfile

    if not argv or not any(Path(argv[0]).glob("*.json.xz")):
        return argv
    folder, tmp = Path(argv[0]), Path(tempfile.mkdtemp(prefix="records-gz-"))      # left for the caller to read
    for p in sorted(folder.glob("*.json.*z")):
        gz = tmp / (p.name.rsplit(".", 1)[0] + ".gz")
        with (lzma if p.suffix == ".xz" else gzip).open(p, "rb") as src, gzip.open(gz, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return [str(tmp), *argv[1:]]


def main(argv: list[str]) -> int:
    core = importlib.import_module("gpulab.diagnose.core")
    here = Path(__file__).resolve().parents[1]
    if Path(core.__file__).resolve().is_relative_to(here) and "--any-gpulab" not in argv:
        raise SystemExit(f"this reads records with an older gpulab, but gpulab is imported from {core.__file__}, this "
                         "checkout: put the older checkout first on PYTHONPATH (or pass --any-gpulab)")
    argv = [a for a in argv if a != "--any-gpulab"]
    dropped: set[str] = set()
    core.analyze = tolerant(core.analyze, dropped)                        # what from_record calls, by these names
    core.StallFacts = tolerant(core.StallFacts, dropped, "stalls.")
    zoo = importlib.import_module("gpulab.diagnose.zoo")
    rc = zoo.main(["records", *gzipped(argv)])
    print(f"inputs the older analyze does not take, dropped: {', '.join(sorted(dropped)) or 'none'}")
    return rc or 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
