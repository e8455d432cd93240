"""Reference answers to notebook 09's free-text exercises (activation checkpointing)."""
from __future__ import annotations

from gpulab.exercises.answers import Answer

MiB = 2**20
BUDGET_S = 0.05         # benchmark's time budget per timing (it still takes at least 3 timed calls)


def _setup(scale: str):
    """The notebook's model (a CheckpointedStack of the lesson's sizes), its precision and batch, as section 1
    and section 2 make them: bf16 (fp16 where not native) autocast on a GPU, plain fp32 on the CPU."""
    import torch
    from gpulab.core.device import pick_device
    from gpulab.lessons.l09_activation_checkpointing import CheckpointedStack, config
    from gpulab.models.precision import half_dtype
    from gpulab.models.sizing import predicted_batch
    device = pick_device()
    cfg = config(scale)
    dtype = half_dtype() if device.type == "cuda" else None
    torch.manual_seed(0)
    model = CheckpointedStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    cfg["batch"] = predicted_batch(cfg["n_blocks"], cfg["batch"], cfg["seq"], cfg["width"], params, dtype is not None)
    return model, cfg, dtype, params


def _experiment(model, k: int, batch: int, dtype, selective: bool = False, blocks=None) -> dict:
    """What the panel's `checkpoint_experiment` measures: bytes kept for backward, the step's peak (GPU only)
    and its time, plus how many block forwards one training step runs (each checkpointed block runs twice)."""
    from gpulab.core.timing import benchmark
    from gpulab.lessons.l09_activation_checkpointing import kept_bytes, step_peak
    from gpulab.models.sizing import saved_for_backward
    from gpulab.models.step import train_step
    from gpulab.models.transformer import make_batch
    model.checkpoint_every, model.selective = k, selective
    try:
        x, y = make_batch(model, batch)
        with _forward_counter(list(model.blocks if blocks is None else blocks)) as calls, saved_for_backward(model) as kept:
            train_step(model, x, y, precision=dtype)
        kept_now = kept_bytes(model, batch, dtype) if selective else kept.bytes
        peak = step_peak(model, batch, dtype)
        t = benchmark(lambda: train_step(model, x, y, precision=dtype), warmup=1, budget_s=BUDGET_S)
        del x, y
    finally:
        model.checkpoint_every, model.selective = 0, False
        model.zero_grad(set_to_none=True)
    return {"forwards": sum(calls), "per block": list(calls), "kept": kept_now, "peak": peak, "ms": t.median_ms}


class _forward_counter:
    """Counts the forward calls of each module in `modules` inside the block. Pre-hooks: a non-reentrant
    checkpoint stops its recomputation as soon as it has rebuilt the last tensor backward needs (PyTorch's
    early stop), so a rebuilt block's forward starts again but need not return."""

    def __init__(self, modules):
        self.modules, self.calls = modules, [0] * len(modules)

    def __enter__(self):
        def hook(i):
            def count(*_):
                self.calls[i] += 1
            return count
        self.handles = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(self.modules)]
        return self.calls

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def _mib(v):
    return None if v is None else v / MiB


def _ex1(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    with memory_guard(quiet=True):
        model, cfg, dtype, _ = _setup(scale)
        runs = {k: _experiment(model, k, cfg["batch"], dtype) for k in (0, 1, 12)}
        del model
    out: dict = {"batch": cfg["batch"], "device": "cuda" if runs[0]["peak"] is not None else "cpu"}
    for k, r in runs.items():
        name = "none" if k == 0 else f"k={k}"
        out[f"{name}: block forwards per step"] = r["forwards"]
        out[f"{name}: kept for backward (MiB)"] = _mib(r["kept"])
        out[f"{name}: peak (MiB)"] = _mib(r["peak"]) if r["peak"] is not None else "not measured on the CPU"
        out[f"{name}: ms per step"] = r["ms"]
    return out


def _expect1(f: dict) -> str | None:
    if not f["k=1: block forwards per step"] == f["k=12: block forwards per step"] == 2 * f["none: block forwards per step"]:
        return "k = 1 and k = 12 did not both run every block's forward twice"
    if not f["k=12: kept for backward (MiB)"] < f["k=1: kept for backward (MiB)"] < f["none: kept for backward (MiB)"]:
        return "k = 12 did not keep less between forward and backward than k = 1 (and k = 1 less than none)"
    if f["device"] != "cuda":
        return None         # no allocator peak on the CPU
    if not f["k=12: peak (MiB)"] >= 0.9 * f["none: peak (MiB)"]:
        return "k = 12's peak fell more than 10% below no checkpointing's"
    if not f["k=1: peak (MiB)"] < f["k=12: peak (MiB)"]:
        return "k = 1's peak was not below k = 12's"
    return None


def _ex2(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.models.sizing import predicted_memory
    with memory_guard(quiet=True):
        model, cfg, dtype, params = _setup(scale)
        batch = 2 * cfg["batch"]
        kept, peak = predicted_memory(cfg["n_blocks"], batch, cfg["seq"], cfg["width"], params, 1, dtype is not None)
        r = _experiment(model, 1, batch, dtype)
        del model
    out = {"batch (twice the notebook's)": batch, "predicted kept (MiB)": kept / MiB,
           "measured kept (MiB)": r["kept"] / MiB, "kept, measured / predicted": r["kept"] / kept,
           "predicted peak (MiB)": peak / MiB}
    if r["peak"] is None:
        out["measured peak (MiB)"] = "not measured on the CPU"
    else:
        out["measured peak (MiB)"] = r["peak"] / MiB
        out["peak, measured / predicted"] = r["peak"] / peak
    return out


def _expect2(f: dict) -> str | None:
    if not 0.8 <= f["kept, measured / predicted"] <= 1.25:
        return "the bytes kept for backward were more than 25% off predicted_memory's"
    ratio = f.get("peak, measured / predicted")
    if ratio is not None and not 0.75 <= ratio <= 1.25:
        return "the measured peak was more than 25% off predicted_memory's"
    return None


class Checkpointed:
    """Notebook 09's section-5 module, made on first use (torch imported lazily): `checkpoint_sequential` of
    `layers` in `segments` segments, inside a module's forward, with use_reentrant=False."""

    @staticmethod
    def make(layers, segments: int):
        import torch
        from torch.utils.checkpoint import checkpoint_sequential

        class _Checkpointed(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers, self.segments = layers, segments

            def forward(self, x):
                return checkpoint_sequential(self.layers, self.segments, x, use_reentrant=False)

        return _Checkpointed()


def _ex3(scale: str) -> dict:
    import torch
    from gpulab.core.device import float32_matmul
    from gpulab.core.memory import memory_guard
    from gpulab.models.step import GRAD_TOL, fp32_loss_and_grads, worst_difference
    from gpulab.models.transformer import make_batch
    out: dict = {}
    with memory_guard(quiet=True):
        model, cfg, dtype, _ = _setup(scale)
        blocks = model.blocks
        half = len(blocks) // 2
        layer1, layer2 = blocks[:half], blocks[half:]
        x, y = make_batch(model, cfg["check_batch"], seed=1)
        with float32_matmul("ieee"):
            ref_loss, ref = fp32_loss_and_grads(model, x, y)
        del x, y
        runs = {"every block (k=1)": _experiment(model, 1, cfg["batch"], dtype)}
        for segments in (2, half):
            model.blocks = torch.nn.Sequential(Checkpointed.make(layer1, segments), Checkpointed.make(layer2, segments))
            try:
                runs[f"seed's form, {segments} segments"] = r = _experiment(model, 0, cfg["batch"], dtype, blocks=blocks)
                if segments == half:
                    x, y = make_batch(model, cfg["check_batch"], seed=1)
                    with float32_matmul("ieee"):
                        loss, grads = fp32_loss_and_grads(model, x, y)
                    out["same loss and gradients"] = (abs(loss - ref_loss) <= GRAD_TOL * abs(ref_loss)
                                                      and worst_difference(grads, ref) <= GRAD_TOL)
                    del x, y, grads
            finally:
                model.blocks = blocks
                model.zero_grad(set_to_none=True)
        del model, ref
    twice = [i for i, n in enumerate(r["per block"]) if n == 2]
    out["blocks"] = len(r["per block"])
    out["checkpointed blocks (forward run twice)"] = len(twice)
    out["blocks not checkpointed (1-based)"] = " ".join(str(i + 1) for i, n in enumerate(r["per block"]) if n == 1)
    for name, run in runs.items():
        out[f"{name}: kept (MiB)"] = _mib(run["kept"])
    out[f"seed's form, {half} segments: peak (MiB)"] = (_mib(r["peak"]) if r["peak"] is not None
                                                        else "not measured on the CPU")
    out["half"] = half
    return out


def _expect3(f: dict) -> str | None:
    half, n = f["half"], f["blocks"]
    if not f["same loss and gradients"]:
        return "the seed's form with half segments did not compute the plain model's loss and gradients"
    if f["checkpointed blocks (forward run twice)"] != n - 2:
        return "not all blocks but the last of each half were checkpointed"
    if f["blocks not checkpointed (1-based)"] != f"{half} {n}":
        return "the blocks left whole were not the last of each half"
    kept = [f[f"{name}: kept (MiB)"] for name in ("every block (k=1)", f"seed's form, {half} segments",
                                                   "seed's form, 2 segments")]
    if not kept[0] < kept[1] < kept[2]:
        return "with half segments the seed's form did not keep less than with 2, and more than every block"
    return None


# -- exercise 4: two more policies ------------------------------------------------------------------
def _policies():
    import torch
    from torch.utils.checkpoint import CheckpointPolicy
    from gpulab.lessons.l09_activation_checkpointing import SAVE_OPS, save_matmuls
    attention = frozenset(op for op in SAVE_OPS if "attention" in str(op))
    gelu = frozenset({torch.ops.aten.gelu.default})

    def keep_attention(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in attention else CheckpointPolicy.PREFER_RECOMPUTE

    def keep_attention_and_gelu(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in attention | gelu else CheckpointPolicy.PREFER_RECOMPUTE

    return {"attention only": keep_attention, "attention + GELU": keep_attention_and_gelu,
            "save_matmuls (the lesson's)": save_matmuls}


def _policy_stack_class():
    import functools
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    from gpulab.lessons.l09_activation_checkpointing import CheckpointedStack, save_matmuls

    class PolicyStack(CheckpointedStack):
        """CheckpointedStack whose run_blocks (copied) takes its policy from `self.policy`."""
        policy = staticmethod(save_matmuls)

        def run_blocks(self, x):
            if not self.selective:
                return super().run_blocks(x)
            k = self.checkpoint_every
            if k < 1:
                raise ValueError(f"selective checkpointing needs checkpoint_every >= 1 (got {k}).")
            context = functools.partial(create_selective_checkpoint_contexts, self.policy)
            for start in range(0, len(self.blocks), k):
                x = checkpoint(self.blocks[start:start + k], x, use_reentrant=False, context_fn=context)
            return x

    return PolicyStack


def _saved_by_policy(model, policy, batch: int, dtype) -> int:
    """Bytes of the outputs `policy` keeps (MUST_SAVE, in the forward) in one step: the policy marks the op,
    a dispatch mode below the checkpoint's own sees that op run and adds up its tensor outputs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy
    from gpulab.models.step import train_step
    from gpulab.models.transformer import make_batch
    state = {"pending": None, "last": None, "bytes": 0}

    def marking(ctx, op, *args, **kwargs):
        decision = policy(ctx, op, *args, **kwargs)
        if decision == CheckpointPolicy.MUST_SAVE and not ctx.is_recompute:
            last, state["last"] = state["last"], None
            if last is not None and last[0] is op:       # the policy is asked after the op ran (torch 2.13)
                state["bytes"] += last[1]
            else:                                        # or before it: the mode adds it when it runs
                state["pending"] = op
        return decision

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else (out,)
            nbytes = sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))
            if state["pending"] is func:
                state["pending"] = None
                state["bytes"] += nbytes
            else:
                state["last"] = (func, nbytes)
            return out

    model.policy = marking
    model.checkpoint_every, model.selective = 1, True
    try:
        x, y = make_batch(model, batch)
        with Sizes():
            train_step(model, x, y, precision=dtype)
        del x, y
    finally:
        del model.policy
        model.checkpoint_every, model.selective = 0, False
        model.zero_grad(set_to_none=True)
    return state["bytes"]


def _ex4(scale: str) -> dict:
    import torch
    from gpulab.core.device import pick_device
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l09_activation_checkpointing import checkpointing_check, config
    from gpulab.models.precision import half_dtype
    from gpulab.models.step import GRAD_TOL
    from gpulab.models.transformer import make_batch
    from gpulab.models.sizing import predicted_batch
    device = pick_device()
    cfg = config(scale)
    dtype = half_dtype() if device.type == "cuda" else None
    out: dict = {"device": device.type, "16-bit": dtype is not None}
    with memory_guard(quiet=True):
        torch.manual_seed(0)
        model = _policy_stack_class()(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
        params = sum(p.numel() for p in model.parameters())
        batch = predicted_batch(cfg["n_blocks"], cfg["batch"], cfg["seq"], cfg["width"], params, dtype is not None)
        elements = cfg["n_blocks"] * batch * cfg["seq"] * cfg["width"]
        x, y = make_batch(model, cfg["check_batch"], seed=1)
        for name, policy in _policies().items():
            model.policy = policy
            try:
                ref_loss, checked = checkpointing_check(model, x, y, ks=(1,), selective=True)
            finally:
                del model.policy
            loss, diff = checked[1]
            out[f"{name}: same loss and gradients"] = abs(loss - ref_loss) <= GRAD_TOL * abs(ref_loss) and diff <= GRAD_TOL
            out[f"{name}: kept bytes per element per block"] = _saved_by_policy(model, policy, batch, dtype) / elements
            model.policy = policy
            try:
                r = _experiment(model, 1, batch, dtype, selective=True)
            finally:
                del model.policy
            out[f"{name}: kept for backward (MiB)"] = (_mib(r["kept"]) if r["kept"] is not None
                                                       else "read from the allocator: GPU only")
            out[f"{name}: peak (MiB)"] = _mib(r["peak"]) if r["peak"] is not None else "not measured on the CPU"
            out[f"{name}: ms per step"] = r["ms"]
        del x, y, model
    return out


def _expect4(f: dict) -> str | None:
    names = ("attention only", "attention + GELU", "save_matmuls (the lesson's)")
    for name in names:
        if not f[f"{name}: same loss and gradients"]:
            return f"the policy '{name}' changed the loss or the gradients"
    attention_row, gelu_row = (2, 8) if f["16-bit"] else (4, 16)     # section 2's table, bytes per element
    att = f["attention only: kept bytes per element per block"]
    gelu = f["attention + GELU: kept bytes per element per block"] - att
    if abs(att - attention_row) >= 0.5:
        return f"the attention-only policy kept {att:.2f} bytes per element, not the attention output's {attention_row}"
    if abs(gelu - gelu_row) >= 0.5:
        return f"keeping GELU's output added {gelu:.2f} bytes per element, not the table's {gelu_row}"
    if f["device"] == "cuda":
        kept = [f[f"{name}: kept for backward (MiB)"] for name in names]
        if not kept[0] < kept[1] < kept[2]:
            return "the allocator did not see attention-only < attention + GELU < save_matmuls in what is kept"
    return None


def _ex5(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.core.timing import benchmark
    from gpulab.models.sizing import fits_budget, largest_batch, memory_budget
    from gpulab.models.step import train_step
    from gpulab.models.transformer import make_batch
    out: dict = {"scale": scale}
    with memory_guard(quiet=True):
        model, cfg, dtype, _ = _setup(scale)
        budget = memory_budget(cap=cfg["budget_cap"])
        out["budget (MiB)"] = budget / MiB
        best = {}
        for k in (0, 1):
            model.checkpoint_every = k
            best[k], _ = largest_batch(lambda b: fits_budget(model, b, budget, dtype), start=1, limit=1024,
                                       resolution=cfg["search_step"])
        for k, b in ((0, best[0]), (1, best[0]), (1, best[1])):
            model.checkpoint_every = k
            x, y = make_batch(model, b)
            t = benchmark(lambda: train_step(model, x, y, precision=dtype), warmup=2)
            model.zero_grad(set_to_none=True)
            del x, y
            name = "none" if k == 0 else "every block"
            out[f"{name} at batch {b}: samples/s"] = b / t.median_ms * 1e3
        model.checkpoint_every = 0
        del model
    out["largest batch, none"], out["largest batch, every block"] = best[0], best[1]
    out["tokens per step, none"] = best[0] * cfg["seq"]
    out["samples/s, every block at its batch / none at its batch"] = (
        out[f"every block at batch {best[1]}: samples/s"] / out[f"none at batch {best[0]}: samples/s"])
    return out


def _expect5(f: dict) -> str | None:
    b0, b1 = f["largest batch, none"], f["largest batch, every block"]
    if not 1 <= b0 <= b1:
        return "checkpointing every block did not fit at least the batch that fits without it"
    if f["scale"] != "full":
        return None         # tiny: weights, not activations, fill the budget; the GPU is far from busy
    if not b1 >= 2 * b0:
        return "checkpointing every block did not double the batch that fits"
    if f["tokens per step, none"] >= 8192 and not f["samples/s, every block at its batch / none at its batch"] <= 1.05:
        return "with the GPU already busy at the plain batch, the larger checkpointed batch still trained faster"
    return None


ANSWERS = [
    Answer("09", 1, run=_ex1, expect=_expect1, text=(
        "Run the panel with k = 12 and with k = 1 at the notebook's batch (the run also does k = 0). Both run "
        "every block's forward twice per step, once in the forward and once when backward rebuilds it, which "
        "the run counts with forward hooks: that is the time. k = 12 keeps the least between forward and "
        "backward (one segment input), but its one segment is the whole stack, so backward rebuilds all 12 "
        "blocks' activations at once and the peak is that of no checkpointing; k = 1 rebuilds one block at a "
        "time. On a GPU the run reads both peaks from the allocator; on the CPU only what is kept.")),
    Answer("09", 2, run=_ex2, expect=_expect2, text=(
        "Call `predicted_memory(n_blocks, 2 * batch, seq, width, params, k=1)` (with half=False on the CPU, "
        "where the step runs in fp32), then run k = 1 at that batch in the panel. The kept bytes are a few "
        "fp32 segment inputs per sample, so they double with the batch, and the measured ones match the "
        "prediction closely; the peak adds one rebuilt block and the weights, gradients and 16-bit copies, "
        "which do not grow with the batch. On a GPU the measured peak lands near the prediction (the run "
        "prints the ratio); the CPU has no allocator peak to read.")),
    Answer("09", 3, run=_ex3, expect=_expect3, text=(
        "Build `torch.nn.Sequential(Checkpointed(layer1, half), Checkpointed(layer2, half))`: each half of "
        "6 blocks becomes 6 one-block segments. `checkpoint_sequential` never checkpoints its last segment, "
        "so 10 of the 12 blocks are checkpointed (the run counts which blocks run their forward twice) and "
        "blocks 6 and 12 keep all their activations; the other ten keep only their input. It keeps less than "
        "the seed's 2 segments and a little more than checkpointing every block, and computes the same loss "
        "and gradients, which the run checks in fp32.")),
    Answer("09", 4, run=_ex4, expect=_expect4, text=(
        "Subclass `CheckpointedStack`, copy `run_blocks` and pass your own policy to "
        "`create_selective_checkpoint_contexts`: one that answers MUST_SAVE only for the attention operators "
        "in `SAVE_OPS`, one that adds `torch.ops.aten.gelu.default`. The first keeps the attention output, "
        "the table's 2 bytes per element under 16-bit autocast (4 in fp32; attention's small log-sum-exp "
        "comes with it); the second adds GELU's output, 8 bytes (16 in fp32). The run counts the bytes each "
        "policy's saved outputs hold and checks loss and gradients; both keep less than `save_matmuls` but "
        "recompute the products in backward, so on a GPU they cost more time than it.")),
    Answer("09", 5, run=_ex5, expect=_expect5, needs="cuda", text=(
        "Take the two batches section 7 found and time a step at each (`benchmark(lambda: train_step(...))`); "
        "divide batch by step time. Checkpointing every block fits a much larger batch but runs each block's "
        "forward twice, about 4/3 of the work per sample; once the plain batch already keeps the GPU busy, "
        "the larger batch gains little throughput, so the plain one trains more samples per second. The "
        "larger batch is worth it when the plain batch is too small to fill the GPU, or when the batch size "
        "itself matters (optimization, batch statistics, a model that does not fit at all otherwise).")),
]
