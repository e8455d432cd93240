"""Models and batches the lessons train. Introduced in notebook 09; reused from 10 on.

- `TransformerStack`: GPT-style blocks (pre-LayerNorm, causal SDPA attention, 4x GELU MLP)
  with activation checkpointing every k blocks as a switch (`checkpoint_every`).
- `make_batch`, `loss_fn`, `autocast`, `train_step`: a deterministic batch and one training step.
- `checkpointing_check`, `accumulation_check` (`GRAD_TOL`, `fp32_loss_and_grads`, `worst_difference`):
  correct before fast, in plain fp32.
- `saved_for_backward`: the bytes autograd keeps between forward and backward (works on the CPU).
- `predicted_memory`, `predicted_batch`: the back-of-envelope for the above, before anything runs,
  and the batch it says fits half the free memory.
- `memory_budget`, `training_peak`, `fits_budget`, `largest_batch`: the memory of a step, and the
  largest batch that fits a budget, found by measuring (never by filling the whole GPU).

Lessons 06 and 07 add:
- `ResNetish` (ResNet-50's layer shapes at full size) and `image_batches`: a CNN and learnable
  synthetic images; `GPT`, `padded_copy` and `token_batches`: a language model whose vocabulary
  can be padded, and learnable token sequences;
- `count_flops` (PyTorch's FlopCounterMode) and `fit_batch` (a batch that fits a memory budget,
  extrapolated from two small measured steps);
- `conv_benchmark_in_fresh_process`: training steps with cudnn.benchmark on or off, each in its
  own process (`python -m gpulab.workloads --benchmark on|off ...`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpulab.memory import free_memory, release, track_peak


class Block(nn.Module):
    """One pre-LayerNorm GPT block: x + attention(LN(x)), then x + MLP(LN(x)). Notebook 09."""

    def __init__(self, width: int, heads: int, device: torch.device | None = None):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, device=device)
        self.qkv = nn.Linear(width, 3 * width, device=device)
        self.proj = nn.Linear(width, width, device=device)
        self.ln2 = nn.LayerNorm(width, device=device)
        self.fc = nn.Linear(width, 4 * width, device=device)
        self.out = nn.Linear(4 * width, width, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TransformerStack(nn.Module):
    """n_blocks GPT blocks, a final LayerNorm and a linear head; (batch, seq, width) in and out. Notebook 09.

    `checkpoint_every = k` groups the blocks into runs of k and checkpoints each run:
    only its input is kept for backward, its inside is recomputed then. k = 0: no checkpointing.
    """

    def __init__(self, n_blocks: int, width: int, heads: int, seq: int, checkpoint_every: int = 0,
                 device: torch.device | None = None):
        super().__init__()
        self.width, self.seq, self.checkpoint_every = width, seq, checkpoint_every
        self.blocks = nn.Sequential(*(Block(width, heads, device) for _ in range(n_blocks)))
        self.ln_f = nn.LayerNorm(width, device=device)
        self.head = nn.Linear(width, width, device=device)

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks on x; with checkpoint_every = k > 0, each run of k blocks is one checkpointed segment."""
        k = self.checkpoint_every
        if k < 0:
            raise ValueError(f"checkpoint_every must be 0 (none) or a positive number of blocks (got {k}).")
        if k == 0:
            return self.blocks(x)            # every block keeps all its activations
        for start in range(0, len(self.blocks), k):
            segment = self.blocks[start:start + k]                 # k blocks (fewer at the end)
            x = checkpoint(segment, x, use_reentrant=False)        # keeps x; recomputes inside
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(self.run_blocks(x)))


def param_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters. Notebook 09."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def make_batch(model: TransformerStack, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random embeddings (batch, seq, width) and, as target, each position's next embedding. Notebook 09."""
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randn(batch, model.seq + 1, model.width, generator=g, device=device)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error, computed in fp32. Notebook 09."""
    return F.mse_loss(out.float(), y)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """`torch.amp.autocast` on `device` in `dtype`; plain fp32 (no autocast) when dtype is None. Notebook 09."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.amp.autocast(device.type, dtype=dtype)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """Forward, loss, backward; gradients land in .grad (earlier ones are dropped). Notebook 09."""
    model.zero_grad(set_to_none=True)
    with autocast(x.device, dtype):
        loss = loss_fn(model(x), y)
    loss.backward()
    return loss.detach()


def accumulate(model: nn.Module, micro_batches, steps: int, dtype: torch.dtype | None = None,
               divide: bool = True) -> None:
    """One effective batch by gradient accumulation: forward and backward on each of `steps`
    micro-batches; the gradients add up in `.grad`. Each loss is divided by `steps`, so the sum
    equals the mean over the whole batch (`divide=False` is the classic mistake). Notebook 10."""
    model.zero_grad(set_to_none=True)
    for x, y in micro_batches:
        with autocast(x.device, dtype):
            loss = loss_fn(model(x), y)
        (loss / steps if divide else loss).backward()


# -- correct before fast: notebooks 09 and 10 (and gpulab bench) ----------------------------------
GRAD_TOL = 1e-5        # largest accepted relative difference of fp32 losses and gradients


def fp32_loss_and_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """The loss and a copy of the gradients of one step of `model` as configured now, without autocast
    (run it under `float32_matmul("ieee")` for plain fp32)."""
    loss = train_step(model, x, y)                    # dtype=None: no autocast
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def worst_difference(grads: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> float:
    """The largest |g - r| of any parameter, relative to that parameter's largest |r|."""
    return max(((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for g, r in zip(grads, ref))


def checkpointing_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        ks: Sequence[int] = (1, 2, 5, 12)) -> tuple[float, dict[int, tuple[float, float]]]:
    """Same weights, same batch, plain fp32 (TF32 off): the loss and gradients of `model` checkpointing
    every k blocks, for each k in `ks`, against none. Notebook 09.

    Returns (the loss without checkpointing, {k: (loss, worst gradient difference)}), the difference
    being the largest |g_k - g| of a parameter relative to that parameter's largest |g|. The model is
    left without checkpointing and without gradients.
    """
    from gpulab.device import float32_matmul

    out = {}
    try:
        with float32_matmul("ieee"):
            model.checkpoint_every = 0
            ref_loss, ref = fp32_loss_and_grads(model, x, y)
            for k in ks:
                model.checkpoint_every = k
                loss, grads = fp32_loss_and_grads(model, x, y)
                out[k] = (loss, worst_difference(grads, ref))
    finally:
        model.checkpoint_every = 0
        model.zero_grad(set_to_none=True)
    return ref_loss, out


def accumulation_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> dict[str, float]:
    """Plain fp32 (TF32 off): the gradients of one batch (x, y) against the same batch in `steps` equal
    micro-batches, accumulated with each loss divided by `steps` (`accumulate`) and without. Notebook 10.

    Returns {"divided": largest |difference| of any entry / the norm of the whole big-batch gradient,
    "undivided": norm of the undivided gradients / the big batch's (the classic mistake: `steps`)}.
    The model is left without gradients.
    """
    from gpulab.device import float32_matmul

    def gradients() -> list[torch.Tensor]:
        return [p.grad.clone() for p in model.parameters()]

    def norm(grads: list[torch.Tensor]) -> float:
        return torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()

    if steps < 1 or x.shape[0] % steps:
        raise ValueError(f"the batch ({x.shape[0]}) must split into {steps} equal micro-batches")
    try:
        with float32_matmul("ieee"):
            train_step(model, x, y)                   # the big batch, lesson 09's step
            big = gradients()
            accumulate(model, zip(x.chunk(steps), y.chunk(steps)), steps)
            accumulated = gradients()
            accumulate(model, zip(x.chunk(steps), y.chunk(steps)), steps, divide=False)
            undivided = gradients()
    finally:
        model.zero_grad(set_to_none=True)
    big_norm = norm(big)
    return {"divided": max((a - b).abs().max().item() for a, b in zip(accumulated, big)) / big_norm,
            "undivided": norm(undivided) / big_norm}


@dataclass
class Saved:
    """Filled in by `saved_for_backward`: distinct storages autograd keeps, by address."""

    storages: dict[int, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


@contextlib.contextmanager
def saved_for_backward(model: nn.Module) -> Iterator[Saved]:
    """Count the bytes autograd saves for backward inside the block, weights excluded. Notebook 09.

    Each storage is counted once (q, k and v are views of one tensor). Inside a
    checkpointed segment PyTorch's own hooks take over, so what a segment does not
    keep is not counted: this is what stays in memory between forward and backward.
    """
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = Saved()

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in weights:
            saved.storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def predicted_memory(n_blocks: int, batch: int, seq: int, width: int, params: int, k: int = 0,
                     half: bool = True) -> tuple[int, int]:
    """Back-of-envelope bytes (kept for backward, peak of a step) when checkpointing every k blocks. Notebook 09.

    Per element of (batch, seq, width): a block keeps 36 bytes under 16-bit autocast (64 in fp32);
    a checkpointed segment keeps only its fp32 input (4); final LayerNorm, head and loss keep 10 (12).
    The peak adds one segment rebuilt during backward, and per parameter the fp32 weight,
    its gradient and, under autocast, its 16-bit copy: 10 bytes (8 in fp32).
    """
    per_block, head, per_param = (36, 10, 10) if half else (64, 12, 8)
    elements = batch * seq * width
    if k == 0:
        kept, rebuilt = n_blocks * per_block * elements, 0
    else:
        kept, rebuilt = -(-n_blocks // k) * 4 * elements, min(k, n_blocks) * per_block * elements
    kept += head * elements
    return kept, kept + rebuilt + per_param * params


def predicted_batch(n_blocks: int, batch: int, seq: int, width: int, params: int, half: bool = True,
                    times: int = 1, fraction: float = 0.5, device: torch.device | None = None) -> int:
    """`batch`, halved until the predicted peak of a step on `times` x batch samples (`predicted_memory`,
    no checkpointing) fits `fraction` of the GPU's free memory now; `batch` unchanged on the CPU.
    Notebooks 09 and 10 (and gpulab bench) size their GPU runs with it before anything is allocated."""
    free = free_memory(device)
    if free is None:
        return batch
    while batch > 1 and predicted_memory(n_blocks, batch * times, seq, width, params, 0, half)[1] > fraction * free[0]:
        batch //= 2
    return batch


def memory_budget(cap: int, fraction: float = 0.5, device: torch.device | None = None) -> int | None:
    """min(cap, fraction x the GPU's free memory now), in bytes; None on the CPU. Notebook 09."""
    free = free_memory(device)
    return None if free is None else int(min(cap, fraction * free[0]))


def training_peak(model: nn.Module, batch: int, dtype: torch.dtype | None = None) -> int | None:
    """Peak bytes of one training step: weights + batch + activations + gradients (None on the CPU). Notebook 09."""
    model.zero_grad(set_to_none=True)
    with track_peak(next(model.parameters()).device) as mem:
        x, y = make_batch(model, batch)
        train_step(model, x, y, dtype)
        del x, y
        model.zero_grad(set_to_none=True)
    return None if mem.peak is None else param_bytes(model) + mem.peak_above_start


def fits_budget(model: nn.Module, batch: int, budget: int,
                dtype: torch.dtype | None = None) -> tuple[bool, int | None]:
    """(fits, peak bytes) of one step at `batch`; out of memory counts as not fitting. Notebook 09.

    On the CPU nothing can be measured: (False, None).
    """
    try:
        peak = training_peak(model, batch, dtype)
    except torch.OutOfMemoryError:
        peak = None               # the failed step's tensors are freed when the except block ends
    model.zero_grad(set_to_none=True)
    release()
    return peak is not None and peak <= budget, peak


def largest_batch(fits: Callable[[int], tuple[bool, int | None]], start: int = 1, limit: int = 1024,
                  resolution: int = 1, max_tries: int = 20) -> tuple[int, list[tuple[int, bool, int | None]]]:
    """Largest batch in [start, limit] that fits: double until one does not, then bisect. Notebook 09.

    Returns the batch (0 if even `start` does not fit) and every trial (batch, fits, peak).
    Doubling means a trial needs at most about twice the memory of one that fitted.
    """
    trials: list[tuple[int, bool, int | None]] = []

    def ok(b: int) -> bool:
        trials.append((b, *fits(b)))
        return trials[-1][1]

    if not ok(start):
        return 0, trials
    lo, hi = start, None
    while hi is None and lo < limit and len(trials) < max_tries:
        b = min(2 * lo, limit)
        lo, hi = (b, None) if ok(b) else (lo, b)
    while hi is not None and hi - lo > resolution and len(trials) < max_tries:
        mid = lo + (hi - lo) // 2 // resolution * resolution
        if mid == lo:
            break
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, trials


# -- lessons 06 and 07: a ResNet-style CNN and a small GPT language model ------------------------
class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 reduce, 3x3 (carries the stride), 1x1 expand x4, each with
    BatchNorm; a projection shortcut where the shape changes. Notebook 06."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1, device: torch.device | None = None):
        super().__init__()
        c_out = planes * self.expansion
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(planes, device=device)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(planes, device=device)
        self.conv3 = nn.Conv2d(planes, c_out, 1, bias=False, device=device)
        self.bn3 = nn.BatchNorm2d(c_out, device=device)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False, device=device),
                                          nn.BatchNorm2d(c_out, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


class ResNetish(nn.Module):
    """A bottleneck ResNet for images of `image` x `image` pixels. Notebook 06; reused in 07.

    With depths=(3, 4, 6, 3), width=64 and 1000 classes it has the layer shapes and the
    parameter count (25.6 M) of ResNet-50 v1.5 (stride on the 3x3 convolution). It is
    gpulab's own code, not torchvision's model: same arithmetic, not the same implementation.
    Stem: 7x7 convolution with stride 2 and a 3x3 max-pool with stride 2; four stages, the
    last three halving the resolution; global average pool; a linear head.
    """

    def __init__(self, depths: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000,
                 image: int = 224, device: torch.device | None = None):
        super().__init__()
        self.depths, self.width, self.classes, self.image = tuple(depths), width, classes, image
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False, device=device),
                                  nn.BatchNorm2d(width, device=device), nn.ReLU(),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        blocks, c_in = [], width
        for i, depth in enumerate(depths):
            planes = width * 2**i
            for j in range(depth):
                blocks.append(Bottleneck(c_in, planes, stride=2 if i > 0 and j == 0 else 1, device=device))
                c_in = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, classes, device=device)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def image_batches(model: ResNetish, batch: int, count: int = 4, seed: int = 0, size: int | None = None,
                  channels_last: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` batches of synthetic images (batch, 3, size, size) and class labels, made on the model's device.

    Learnable on purpose, so loss curves fall: each class has a fixed random 8x8 colour pattern,
    enlarged to the image size; an image is its class's pattern plus as much Gaussian noise.
    The patterns depend only on `seed`, so batches of other sizes belong to the same task.
    Notebook 06.
    """
    device = next(model.parameters()).device
    size = size or model.image
    g = torch.Generator(device=device).manual_seed(seed)
    patterns = torch.randn(model.classes, 3, 8, 8, generator=g, device=device)
    out = []
    for _ in range(count):
        labels = torch.randint(0, model.classes, (batch,), generator=g, device=device)
        x = F.interpolate(patterns[labels], size=(size, size), mode="nearest")
        x = x + torch.randn(x.shape, generator=g, device=device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out.append((x, labels))
    return out


class GPT(nn.Module):
    """A GPT language model: token and position embeddings, lesson 09's `Block`s, a final LayerNorm
    and a linear head over the vocabulary. Notebooks 06 and 07.

    `pad_to = m` rounds the embedding table and the head up to a multiple of m rows
    (`padded_vocab`); the loss reads only the first `vocab` logits, so padding changes the
    shapes the GPU multiplies, never the model's predictions.
    """

    def __init__(self, vocab: int, n_blocks: int, width: int, heads: int, seq: int, pad_to: int = 1,
                 device: torch.device | None = None):
        super().__init__()
        if vocab < 2 or pad_to < 1:
            raise ValueError(f"need vocab >= 2 and pad_to >= 1 (got vocab={vocab}, pad_to={pad_to}).")
        self.config = dict(vocab=vocab, n_blocks=n_blocks, width=width, heads=heads, seq=seq)
        self.vocab, self.seq, self.width = vocab, seq, width
        self.padded_vocab = -(-vocab // pad_to) * pad_to
        self.tok = nn.Embedding(self.padded_vocab, width, device=device)
        self.pos = nn.Embedding(seq, width, device=device)
        self.blocks = nn.Sequential(*(Block(width, heads, device) for _ in range(n_blocks)))
        self.ln_f = nn.LayerNorm(width, device=device)
        self.head = nn.Linear(width, self.padded_vocab, bias=False, device=device)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (batch, seq, padded_vocab) for token ids (batch, seq)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln_f(self.blocks(self.tok(idx) + self.pos(pos))))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the next token, in fp32, over the real vocabulary only."""
        logits = self(idx)[..., :self.vocab]
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))


def padded_copy(model: GPT, multiple: int) -> GPT:
    """`model` with its vocabulary padded to a multiple of `multiple`: the same weights, and zero
    rows for the padding tokens, which no input uses and the loss never reads. Notebook 07."""
    device = next(model.parameters()).device
    padded = GPT(**model.config, pad_to=multiple, device=device)
    with torch.no_grad():
        for p, q in zip(model.parameters(), padded.parameters()):
            q.zero_()
            q[:p.shape[0]].copy_(p)          # only the embedding and the head differ, in rows
    padded.train(model.training)
    return padded


def token_batches(model: GPT, batch: int, count: int = 4, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` batches of token ids (batch, seq) and next-token targets, made on the model's device.

    Learnable on purpose: a fixed random permutation of the vocabulary says which token follows
    which, and each sequence starts at a random token. Notebooks 06 and 07.
    """
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    follow = torch.randperm(model.vocab, generator=g, device=device)
    out = []
    for _ in range(count):
        tokens = torch.empty(batch, model.seq + 1, dtype=torch.long, device=device)
        tokens[:, 0] = torch.randint(0, model.vocab, (batch,), generator=g, device=device)
        for t in range(model.seq):
            tokens[:, t + 1] = follow[tokens[:, t]]
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of `fn()` (e.g. a forward and backward pass), counted by PyTorch's
    FlopCounterMode: matrix products, convolutions and attention, 2 per multiply-add. Notebook 06."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def fit_batch(peak_at: Callable[[int], int | None], wanted: int, budget: int | None, probe: int = 4) -> int:
    """The batch to run: `wanted`, halved until the peak memory, extrapolated in a straight line
    from two measured small batches (`probe` and 2 x `probe`), fits `budget` bytes. Notebook 06.

    `peak_at(b)` runs one training step at batch b and returns its peak bytes (None on the CPU,
    where `wanted` is returned unchanged). Costs two small steps, never a large trial.
    """
    if budget is None:
        return wanted
    small, large = peak_at(probe), peak_at(2 * probe)
    if small is None or large is None:
        return wanted
    per_sample = max(large - small, 1) / probe
    fixed = small - probe * per_sample
    batch = wanted
    while batch > 1 and fixed + batch * per_sample > budget:
        batch //= 2
    return batch


# -- notebook 07: cudnn.benchmark, measured in a fresh process ------------------------------------
# cuDNN keeps the convolution plan it chose for each shape (and dtype, layout, ...) for the life
# of the process, whatever torch.backends.cudnn.benchmark says when it is reused. Comparing the
# flag on and off on the same shapes inside one process would time the first setting's choices
# twice, so each setting runs in its own process.
def conv_step_times(benchmark_on: bool, fixed: int = 224, varying: Sequence[int] = (160, 192, 256),
                    batch: int = 32, precision: str = "bf16", depths: Sequence[int] = (3, 4, 6, 3),
                    width: int = 64, classes: int = 1000, repeat: int = 10, startup_size: int = 64) -> dict:
    """Training-step times of a ResNetish with torch.backends.cudnn.benchmark = `benchmark_on`,
    in *this* process (run it in a fresh one: see conv_benchmark_in_fresh_process). Notebook 07.

    - "start-up": one step on `startup_size` images, which loads cuDNN and cuBLAS (with the search
      off in both settings: autotuning shapes that are never used again would only add time);
    - "first step": the first step on `fixed`-size images (cuDNN picks its plans for this shape);
    - "steady": further steps on the same size;
    - "new sizes": one step per size in `varying`, each size new to the process.
    Returns the samples (ms) of each, the device and the timing method.
    """
    import itertools

    from gpulab.device import pick_device
    from gpulab import precision as P
    from gpulab.timing import benchmark

    sizes = [startup_size, fixed, *varying]
    if len(set(sizes)) != len(sizes) or min(sizes) < 32:
        raise ValueError(f"the start-up size, the fixed size and the varying sizes must all differ and be "
                         f">= 32 pixels (got {startup_size}, {fixed}, {list(varying)}).")
    P.check(precision)
    device = pick_device()
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False           # the start-up step below: loading, no search
    try:
        torch.manual_seed(0)
        model = ResNetish(tuple(depths), width, classes, image=fixed, device=device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = P.make_scaler(precision, device)

        def step(xy: tuple[torch.Tensor, torch.Tensor]) -> None:
            P.train_step(model, opt, *xy, P.classification_loss, precision, scaler)

        startup = image_batches(model, batch, count=1, size=startup_size)[0]
        fixed_batches = image_batches(model, batch, count=2)
        new_batches = iter([image_batches(model, batch, count=1, size=s)[0] for s in varying])
        cycle = itertools.cycle(fixed_batches)
        times = {"start-up": benchmark(lambda: step(startup), warmup=0, repeat=1, device=device)}
        torch.backends.cudnn.benchmark = benchmark_on
        times |= {
            "first step": benchmark(lambda: step(next(cycle)), warmup=0, repeat=1, device=device),
            "steady": benchmark(lambda: step(next(cycle)), warmup=1, repeat=repeat, device=device),
            "new sizes": benchmark(lambda: step(next(new_batches)), warmup=0, repeat=len(varying),
                                   device=device),
        }
    finally:
        torch.backends.cudnn.benchmark = before
    t = times["steady"]
    return {"benchmark": benchmark_on, "device": t.device, "method": t.method, "fixed": fixed,
            "varying": list(varying), "batch": batch, "precision": precision,
            "samples_ms": {k: list(v.samples_ms) for k, v in times.items()}}


def conv_benchmark_in_fresh_process(benchmark_on: bool, fixed: int = 224, varying: Sequence[int] = (160, 192, 256),
                                    batch: int = 32, precision: str = "bf16", depths: Sequence[int] = (3, 4, 6, 3),
                                    width: int = 64, classes: int = 1000, repeat: int = 10,
                                    timeout_s: float = 300) -> dict:
    """`conv_step_times` in a new Python process (fresh cuDNN caches); returns a `Timing` per phase. Notebook 07."""
    import json
    import subprocess
    import sys

    from gpulab.timing import summarize

    cmd = [sys.executable, "-m", "gpulab.workloads", "--benchmark", "on" if benchmark_on else "off",
           "--fixed", str(fixed), "--varying", ",".join(map(str, varying)), "--batch", str(batch),
           "--precision", precision, "--depths", ",".join(map(str, depths)), "--width", str(width),
           "--classes", str(classes), "--repeat", str(repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode == 2:          # the child refused the settings
        raise ValueError(proc.stderr.strip().splitlines()[-1].removeprefix("gpulab.workloads: "))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError("the cudnn.benchmark process failed: " + " | ".join(tail))
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: summarize(v, raw["device"], raw["method"]) for k, v in raw["samples_ms"].items()}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",") if v]

    p = argparse.ArgumentParser(description="Time a ResNetish training step with cudnn.benchmark on or off "
                                            "(notebook 07); print JSON.")
    p.add_argument("--benchmark", choices=("on", "off"), required=True)
    p.add_argument("--fixed", type=int, default=224)
    p.add_argument("--varying", type=ints, default=[160, 192, 256])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--depths", type=ints, default=[3, 4, 6, 3])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=10)
    a = p.parse_args(argv)
    try:
        out = conv_step_times(a.benchmark == "on", a.fixed, a.varying, a.batch, a.precision, a.depths,
                              a.width, a.classes, a.repeat)
    except ValueError as err:
        print(f"gpulab.workloads: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
