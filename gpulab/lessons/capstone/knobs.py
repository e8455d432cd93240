"""Lesson 13's knobs (notebook 13, the capstone): the sizes of its two jobs and the timing budgets at each scale
(`CONFIG`, read with `config(scale)`), and the constants every run shares: the memory and fp32 speed a job is
sized for, the learning rate, the batches a run cycles through, the updates its checks compare, the vocabulary's
alignment, the micro-batches of `accumulation` and the loader's workers. `gpulab.lessons.l13_capstone`, the
lesson's face, shows them to the notebook."""
from __future__ import annotations

from typing import Any

from gpulab.core.device import resolve_scale


CONFIG: dict[str, dict[str, Any]] = {
    "tiny": dict(
        gpt=dict(vocab=251, n_blocks=2, width=64, heads=4, seq=32, batch=8),
        cnn=dict(depths=(1, 1, 1, 1), width=8, classes=10, image=32, batch=16),
        budget_s=0.05,              # seconds of timed steps per run (`benchmark`'s budget)
        monitor_budget_s=0.05,      # the same, while GPU busy % is sampled (no NVML on the CPU)
        max_repeat=5,               # at most this many timed steps per run
        monitor_max_repeat=5,       # the same, while GPU busy % is sampled
        seed_4090_batch=4,          # seed 004's first batch, doubled row by row
        fp8_sizes=(32, 64),         # n of the n x n x n products FP8 and bf16 are compared at (`fp8_crossover`)
        # time to a loss (`time_to_loss`): a byte-level GPT on the stdlib's source; the fp32 baseline trains for
        # budget_s seconds, its last validation loss is the target, a variant gets cap x that long to reach it
        ttl=dict(gpt=dict(vocab=256, n_blocks=2, width=64, heads=4, seq=64, batch=16), budget_s=1.0, cap=1.5,
                 eval_every=5, eval_batches=4, text_bytes=2**20),
        step_s=None,                # no time cap on the CPU (no ceilings to predict a step with)
    ),
    "full": dict(
        # GPT: 8 blocks of width 2048 (16 heads of 128), sequences of 1024 tokens, GPT-2's vocabulary of 50257.
        # Width 2048, not 1024: on the course's H200 (torch 2.11, 2026-11-29) a bf16 step of 12 x 1024 reached
        # 386 model TFLOP/s compiled (57% of the measured peak), 12 x 2048 reached 480 (71%): bigger products
        # and 128-wide attention heads keep the Tensor Cores busier, and the rest of the step weighs less.
        # 8 blocks, not 12, keep the notebook (and torch.compile's first call) inside the course's time budget.
        gpt=dict(vocab=50257, n_blocks=8, width=2048, heads=16, seq=1024, batch=8),
        # CNN: ResNet-50's layer shapes (25.6 M parameters) on 224 x 224 images, 1000 classes.
        cnn=dict(depths=(3, 4, 6, 3), width=64, classes=1000, image=224, batch=128),
        budget_s=0.3,
        # NVML's busy % covers its past sample period (up to 1 s, by product): a run's samples of its first second
        # cover time before it and are dropped (`runner`), so a sampled run is timed for 2 s, a second of it read
        monitor_budget_s=2.0,
        max_repeat=15,
        monitor_max_repeat=400,     # a sampled run's 2 s are not cut short by max_repeat (a 5 ms step: 400)
        seed_4090_batch=32,         # the seed's own first batch (SEED_4090)
        # from launch-bound products to ones that fill any GPU with FP8 (1.1 TFLOP at 8192, 8.8 at 16384)
        fp8_sizes=(256, 512, 1024, 2048, 4096, 8192, 16384),
        # 6 blocks of 512 (19 M weights), 32 x 512 bytes a step: about 1.8 TFLOP, so a GPU's fp32 baseline
        # takes thousands of steps' worth of budget only where fp32 is fast; 16 MiB of text (train + held out)
        ttl=dict(gpt=dict(vocab=256, n_blocks=6, width=512, heads=8, seq=512, batch=32), budget_s=30.0, cap=1.5,
                 eval_every=20, eval_batches=16, text_bytes=16 * 2**20),
        # the most an fp32 baseline step may take, predicted from this GPU's fp32 matmul ceiling
        # (`Runs.fit_batches`): on the course's H200 a GPT step of batch 8 takes about 1 s, so an H200
        # keeps every batch, and a T4 (fp32 about 8 TFLOP/s on its datasheet) lowers the GPT's to fit
        step_s=1.5,
    ),
}


def config(scale: str | None = None) -> dict[str, Any]:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`): each job's
    sizes ("gpt", "cnn"; copies, as `job_config` gives them) and how long each run is timed."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in CONFIG[resolve_scale(scale)].items()}


MEMORY_CAP = 64 * 2**30   # the most memory a job's step is sized to take, below half the free GPU memory
STEP_SHARE = 0.5          # share of the fp32 matmul ceiling an fp32 training step is predicted to reach
STATE_SHARE = 0.5         # share of the memory budget the fp32 training state (16 bytes a parameter) may take
LR = 1e-3              # AdamW's learning rate for both jobs


POOL = 4               # distinct batches per run, cycled (the first LOSS_STEPS are the loss check's)


LOSS_STEPS = 3         # steps from the starting weights whose losses are compared with the baseline's


ALIGN = 64             # `aligned` pads the vocabulary to a multiple of this (lesson 07)


ACCUMULATION = 4       # micro-batches per step when a waterfall adds `accumulation`


LOADER_WORKERS = 4     # DataLoader worker processes when `loader` is on, at most this host's cores (runner.loader_workers)
