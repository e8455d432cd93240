"""The GPT-style block stack lessons 09, 10 and 14 train.

- `Block`: pre-LayerNorm, causal SDPA attention, 4x GELU MLP.
- `TransformerStack`: n blocks with activation checkpointing every k blocks as a switch (`checkpoint_every`).
- `make_batch`, `loss_fn`, `param_bytes`: a deterministic batch, the loss (MSE in fp32), parameter bytes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# The course's TransformerStack (lessons 09 and 10; `TransformerStack(**STACK[scale])`): 12 GPT blocks,
# the full one 152 M parameters (12 x (12 C^2 + 13 C) + C^2 + 3 C at width C = 1024), run at seq 1024.
STACK = {
    "tiny": dict(n_blocks=12, width=64, heads=4, seq=32),
    "full": dict(n_blocks=12, width=1024, heads=16, seq=1024),
}


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
