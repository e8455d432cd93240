"""Speed tied to quality (notebook 13, section 14): `time_to_loss` trains a byte-level GPT on the standard
library's source (`gpulab.models.text`) with some toggles until it reaches the validation loss the fp32 baseline
reaches in a fixed time; `LossCurve` is its validation loss against the seconds of training, and
`validation_loss` measures one point of it."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from gpulab.core.device import pick_device
from gpulab.core.timing import stopwatch
from gpulab.lessons.capstone.jobs import JOBS
from gpulab.lessons.capstone.knobs import config
from gpulab.lessons.capstone.options import Options
from gpulab.lessons.capstone.runner import make_trainer, run_context
from gpulab.models import precision as P
from gpulab.models import text


# -- speed tied to quality: time to a validation loss ------------------------------------------------
@dataclass
class LossCurve:
    """A byte-level GPT trained on the stdlib's source (`gpulab.models.text`) with `options`: its validation
    loss after each `eval_every` steps, against the seconds of training so far (host clock, synchronized;
    validation not counted; the first step, which compiles when compile is on, counted apart)."""

    options: Options
    points: list[tuple[int, float, float]]      # (steps, training seconds, validation loss)
    first_step_s: float
    tokens_per_step: int
    target: float | None = None
    reached: tuple[int, float] | None = None    # (steps, seconds) of the first evaluation at or below the target
    notes: tuple[str, ...] = ()

    @property
    def final_loss(self) -> float:
        return self.points[-1][2]

    @property
    def tokens_per_s(self) -> float | None:
        steps, seconds = self.points[-1][0] - 1, self.points[-1][1]      # the first step is not in the seconds
        return steps * self.tokens_per_step / seconds if seconds > 0 else None


def validation_loss(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                    device: torch.device) -> float:
    """Mean next-byte loss over the held-out `batches`, in eval mode without gradients, in fp32 whatever the run
    trains in: no autocast, TF32 off, FP8 layers as plain linear layers (`fp32_layers`). Every run's weights are
    fp32 (autocast and FP8 round copies of them), so every run is judged by the same arithmetic as the fp32
    baseline whose loss is the target; a loss evaluated in 16 bits would add its own rounding to the comparison."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False), P.fp32_math("ieee"), fp32_layers(model):
            return sum(float(P.language_model_loss(model, x.to(device), y.to(device))) for x, y in batches) / len(batches)
    finally:
        model.train(was)


@contextlib.contextmanager
def fp32_layers(model: nn.Module):
    """`model`'s FP8 linear layers (`precision.Fp8Linear`) as plain `nn.Linear`s inside the block: the same
    parameters, products in fp32."""
    fp8 = [m for m in model.modules() if type(m) is P.Fp8Linear]
    for m in fp8:
        m.__class__ = nn.Linear
    try:
        yield model
    finally:
        for m in fp8:
            m.__class__ = P.Fp8Linear


def time_to_loss(options: Options = Options(), target: float | None = None, *, budget_s: float | None = None,
                 scale: str | None = None, seed: int = 0, device: torch.device | None = None) -> LossCurve:
    """Train the byte-level GPT of `config(scale)["ttl"]` from the weights seed `seed` gives, on random
    windows of the stdlib's source (the same windows in the same order for every `options`), and evaluate
    it on held-out files every `eval_every` steps. Without `target`: for `budget_s` seconds of training (the
    baseline, whose last loss is then the target). With it: until an evaluation is at or below it, or
    `cap` x `budget_s` seconds. The loader toggle is left out (the windows are cut in this loop); a
    combination this device cannot run raises ValueError with the reason."""
    device = device or pick_device()
    knobs = config(scale)["ttl"]
    cfg = dict(knobs["gpt"])
    notes = []
    if options.loader:
        options = options.without("loader")
        notes.append("loader left out: the windows are cut from the text in the training loop")
    budget_s = knobs["budget_s"] if budget_s is None else budget_s
    limit_s = budget_s * (knobs["cap"] if target is not None else 1.0)
    train_text, val_text = text.stdlib_source(knobs["text_bytes"])
    val = [text.windows(val_text, cfg["batch"], cfg["seq"], torch.Generator().manual_seed(10_000 + i))
           for i in range(knobs["eval_batches"])]
    g = torch.Generator().manual_seed(seed)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = text.windows(train_text, cfg["batch"], cfg["seq"], g)
        return x.to(device), y.to(device)

    with run_context("gpt", options, cfg["batch"], device):
        torch.manual_seed(seed)
        trainer = make_trainer("gpt", options, JOBS["gpt"].build(cfg, device), device)
        model, train = trainer.model, trainer.train
        with stopwatch(device=device) as first:
            train(*batch())
        steps, seconds, reached = 1, 0.0, None
        points = [(steps, seconds, validation_loss(model, val, device))]
        while seconds < limit_s:
            with stopwatch(device=device) as segment:
                for _ in range(knobs["eval_every"]):
                    train(*batch())
            steps, seconds = steps + knobs["eval_every"], seconds + segment.ms / 1e3
            points.append((steps, seconds, validation_loss(model, val, device)))
            if target is not None and points[-1][2] <= target:
                reached = (steps, seconds)
                break
        del model, train, trainer              # before the memory check at the block's end: nothing held
    return LossCurve(options, points, first.ms / 1e3, cfg["batch"] * cfg["seq"], target, reached, tuple(notes))
