"""Transformer models of the zoo, written from scratch the way people write them (minGPT / nanoGPT style):
a GPT-2 language model, a BERT-style encoder classifier and a ViT, sharing one pre-LN block whose
attention is either hand-written ("manual": scores, mask, softmax, @ v) or PyTorch's fused
scaled_dot_product_attention ("sdpa"). Plain PyTorch, nothing of gpulab. Each model is built on the CPU
and moved to `device`, so a seed gives the same weights on every device."""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, attention="sdpa", causal=False, max_len=1024):
        super().__init__()
        assert n_embd % n_head == 0 and attention in ("sdpa", "manual")
        self.n_head, self.attention, self.causal = n_head, attention, causal
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        if attention == "manual" and causal:
            self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len),
                                 persistent=False)

    def forward(self, x, keep=None):
        """x: (B, T, C); keep: (B, T) bool, True for the tokens that may be attended to (None: all)."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            mask = None if keep is None else keep[:, None, None, :]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if self.causal:
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            if keep is not None:
                att = att.masked_fill(~keep[:, None, None, :], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, attention="sdpa", causal=False, max_len=1024):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = SelfAttention(n_embd, n_head, attention, causal, max_len)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x, keep=None):
        x = x + self.attn(self.ln_1(x), keep)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """GPT-2: token + position embeddings, causal pre-LN blocks, final LN, head tied to the token
    embedding. forward(idx) -> logits (B, T, vocab)."""

    def __init__(self, vocab, n_layer, n_head, n_embd, seq, attention="sdpa", device=None):
        super().__init__()
        self.seq = seq
        self.wpe = nn.Embedding(seq, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, attention, True, seq) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.wte = nn.Embedding(vocab, n_embd)     # made last: the vocabulary's size changes no other init
        with torch.no_grad():                      # GPT-2's N(0, 0.02) embeddings
            self.wpe.weight.mul_(0.02)
            self.wte.weight.mul_(0.02)
        if device is not None:
            self.to(device)

    def forward(self, idx):
        B, T = idx.shape
        assert T <= self.seq, f"sequence of {T} tokens, the model holds {self.seq}"
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight)


class Encoder(nn.Module):
    """BERT-style classifier: token + position embeddings, pre-LN blocks that attend to the tokens that
    are not `pad_id`, final LN, the first ([CLS]) token -> Linear to `classes`. forward(ids) -> logits."""

    def __init__(self, vocab, n_layer, n_head, n_embd, max_len, classes, attention="sdpa", pad_id=0,
                 device=None):
        super().__init__()
        self.pad_id = pad_id
        self.tok = nn.Embedding(vocab, n_embd, padding_idx=pad_id)
        self.pos = nn.Embedding(max_len, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, attention, False, max_len) for _ in range(n_layer))
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, classes)
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)
        if device is not None:
            self.to(device)

    def forward(self, ids):
        B, T = ids.shape
        keep = ids != self.pad_id
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        for block in self.blocks:
            x = block(x, keep)
        return self.head(self.ln(x[:, 0]))


class ViT(nn.Module):
    """Vision Transformer: Conv2d patch embedding, class token, learned position embeddings, pre-LN
    blocks, final LN, the class token -> Linear to `classes`. forward(images (B, 3, H, W)) -> logits."""

    def __init__(self, image, patch, n_layer, n_head, n_embd, classes, attention="sdpa", device=None):
        super().__init__()
        n = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(3, n_embd, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, n_embd))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, n_embd) * 0.02)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, attention, False, n + 1) for _ in range(n_layer))
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, classes)
        if device is not None:
            self.to(device)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2)          # (B, patches, C)
        x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x[:, 0]))
