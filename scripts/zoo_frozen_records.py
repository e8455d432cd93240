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


def main(argv: list[str]) -> int:
    core = importlib.import_module("gpulab.diagnose.core")
    if "/frozen" not in (core.__file__ or "") and "--any-gpulab" not in argv:
        raise SystemExit(f"this reads records with an older gpulab, but gpulab is imported from {core.__file__}: "
                         "put the older checkout first on PYTHONPATH (or pass --any-gpulab)")
    argv = [a for a in argv if a != "--any-gpulab"]
    original = core.analyze
    known = set(inspect.signature(original).parameters)
    dropped: set[str] = set()

    def analyze(*args, **kwargs):
        extra = set(kwargs) - known
        dropped.update(extra)
        return original(*args, **{k: v for k, v in kwargs.items() if k not in extra})

    core.analyze = analyze
    import dataclasses
    stall_cls = core.StallFacts
    stall_known = {f.name for f in dataclasses.fields(stall_cls)}

    def stall_facts(**kwargs):          # a newer record's stall fields the older StallFacts lacks (every_chunk)
        extra = set(kwargs) - stall_known
        dropped.update(f"stalls.{k}" for k in extra)
        return stall_cls(**{k: v for k, v in kwargs.items() if k not in extra})

    core.StallFacts = stall_facts
    zoo = importlib.import_module("gpulab.diagnose.zoo")
    rc = zoo.main(["records", *argv])
    print(f"inputs the older analyze does not take, dropped: {', '.join(sorted(dropped)) or 'none'}")
    return rc or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
