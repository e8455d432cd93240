"""Real text that every machine has without a download: the Python standard library's own source, as bytes.

Notebook 13 trains its GPT on it to a validation loss (`l13_capstone.time_to_loss`): a byte is a token
(a vocabulary of 256), the files are read in a fixed order, and every 20th file is held out for validation,
so no window of validation text was ever trained on. The same Python version gives the same bytes on any
machine; another version gives other text, a different loss curve, not a different lesson.

- `stdlib_source(max_bytes)`: the `.py` files under `sysconfig`'s stdlib path, sorted by relative path,
  joined with a newline, until `max_bytes`; split into (train, validation) uint8 tensors.
- `windows(data, batch, seq, generator)`: `batch` random windows of `seq + 1` bytes, as (x, y) int64
  tensors on the CPU (y is x shifted by one: the next byte).
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

VOCAB = 256          # one token per byte
HOLD_OUT_EVERY = 20  # every 20th file (by sorted path) is validation text


def stdlib_files() -> list[Path]:
    """The standard library's `.py` files (not site-packages), sorted by their path below the stdlib folder."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts and p.is_file()]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def stdlib_source(max_bytes: int = 32 * 2**20) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): uint8 tensors of the stdlib's source, at most `max_bytes` read in all. ValueError
    with the reason when there is too little (a Python without its source files, as some slim images ship)."""
    if max_bytes < 2**16:
        raise ValueError(f"max_bytes must be at least 64 KiB (got {max_bytes})")
    train, val, total = [], [], 0
    for i, path in enumerate(stdlib_files()):
        try:
            data = path.read_bytes() + b"\n"
        except OSError:
            continue
        (val if i % HOLD_OUT_EVERY == 0 else train).append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if sum(map(len, val)) < 2**12 or sum(map(len, train)) < 2**15:
        raise ValueError(f"too little Python source under {sysconfig.get_paths()['stdlib']} ({total} bytes): this "
                         "Python ships without its standard library's .py files")
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
    return as_tensor(train), as_tensor(val)


def windows(data: torch.Tensor, batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` windows of `seq + 1` consecutive bytes of `data` at random starts: (x, y), int64, (batch, seq)."""
    if data.numel() <= seq + 1:
        raise ValueError(f"{data.numel()} bytes of text cannot give windows of {seq + 1}")
    starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=generator)
    rows = torch.stack([data[s:s + seq + 1] for s in starts.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]
