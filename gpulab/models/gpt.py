"""A GPT language model and its data: `GPT` (token and position embeddings, lesson 09's blocks, a tied
head), `padded_copy` (the same model with its vocabulary padded to a multiple, lesson 07) and
`token_batches` (learnable synthetic token sequences). Lessons 06, 07 and the capstone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from gpulab.models.transformer import Block


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
