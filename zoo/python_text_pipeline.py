"""A BERT-style encoder classifier (6 layers, 12 heads, 768 wide, 128 tokens, batch 64, 2 classes) trained in
bf16 autocast with fused AdamW on text. The text pipeline is plain Python in the training loop's own
thread: each batch picks 64 reviews from a synthetic corpus and tokenizes them as BERT's original
tokenization.py does (lower-case, strip accents, split on whitespace and punctuation character by
character, then WordPiece by greedy longest match in a dict), truncates and pads the lists of ids,
and makes tensors with torch.tensor."""
import os
import string
import unicodedata

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import Encoder

FIXES = {
    "input_bound": "the same pipeline in a Dataset (item k is batch k) read by a DataLoader with 4 workers, "
                   "pinned memory, copied with non_blocking=True",
    "launch_bound": GRAPHS_FIX,
}

SIZES = {"tiny": dict(layers=2, heads=2, width=64, max_len=32, batch=8, words=2_000, known=500, reviews=500,
                     review_len=20),
         "full": dict(layers=6, heads=12, width=768, max_len=128, batch=64, words=60_000, known=20_000,
                      reviews=20_000, review_len=200)}
PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"


def make_corpus(words, known, reviews, review_len, seed, **_):
    """Reviews of Zipf-distributed random words with commas, their labels, and a WordPiece vocabulary:
    the `known` most frequent words, every letter and pair of letters, alone and as ##piece."""
    r = np.random.default_rng(seed)
    letters = r.integers(ord("a"), ord("z") + 1, (words, 10), dtype=np.uint8)
    lexicon = [bytes(row[:n]).decode() for row, n in zip(letters, r.integers(2, 11, words))]
    zipf = 1 / np.arange(1, words + 1)
    lengths = r.integers(review_len // 4, review_len * 2, reviews)
    ranks = np.split(r.choice(words, lengths.sum(), p=zipf / zipf.sum()), np.cumsum(lengths)[:-1])
    texts = [" ".join(lexicon[i] + ("," if i % 13 == 0 else "") for i in review).capitalize() + "."
             for review in ranks]
    pieces = list(string.ascii_lowercase) + [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
    pieces = [PAD, UNK, CLS] + list(string.punctuation) + lexicon[:known] + pieces + ["##" + p for p in pieces]
    return texts, r.integers(0, 2, reviews).tolist(), {p: i for i, p in enumerate(dict.fromkeys(pieces))}


def basic_tokenize(text):
    """Lower-case, strip accents, split on whitespace and punctuation (BERT's BasicTokenizer)."""
    words, word = [], ""
    for ch in unicodedata.normalize("NFD", text.lower()):
        cat = unicodedata.category(ch)
        if cat == "Mn":
            continue
        if ch.isspace() or cat[0] == "P":
            words += ([word] if word else []) + ([ch] if cat[0] == "P" else [])
            word = ""
        else:
            word += ch
    return words + [word] if word else words


def wordpiece(word, vocab):
    """Greedy longest-match-first WordPiece (BERT's WordpieceTokenizer)."""
    ids, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                ids.append(vocab[piece])
                break
        else:
            return [vocab[UNK]]
        start = end
    return ids


class Reviews(Dataset):
    """Item k is batch k: (ids (batch, max_len) padded with [PAD], labels (batch,))."""

    def __init__(self, cfg, seed):
        self.texts, self.labels, self.vocab = make_corpus(**cfg, seed=seed)
        self.batch, self.max_len, self.seed = cfg["batch"], cfg["max_len"], seed

    def __len__(self):
        return 1 << 30

    def __getitem__(self, k):
        batch, labels = [], []
        for i in rng(self.seed, k).integers(0, len(self.texts), self.batch):
            ids = [self.vocab[CLS]]
            for word in basic_tokenize(self.texts[i]):
                ids.extend(wordpiece(word, self.vocab))
            ids = ids[:self.max_len]
            batch.append(ids + [self.vocab[PAD]] * (self.max_len - len(ids)))
            labels.append(self.labels[i])
        return torch.tensor(batch), torch.tensor(labels)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    data = Reviews(cfg, seed)
    model = Encoder(len(data.vocab), cfg["layers"], cfg["heads"], cfg["width"], cfg["max_len"], 2,
                    pad_id=data.vocab[PAD], device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    perm = rows(cfg["batch"], reorder)
    it = None
    if fix == "input_bound":
        it = iter(DataLoader(data, batch_size=None, num_workers=max(1, min(4, (os.cpu_count() or 2) - 1)),
                             pin_memory=device.type == "cuda", persistent_workers=True, prefetch_factor=4))
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        if fix == "input_bound":
            ids, y = (t.to(device, non_blocking=True) for t in next(it))
        else:
            ids, y = (t.to(device) for t in data[k])
        k += 1
        ids, y = reordered(perm, ids, y)
        mark()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(forward(ids), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def close():
        if it is not None:
            it._shutdown_workers()

    step.model = model
    step.close = close
    return step
