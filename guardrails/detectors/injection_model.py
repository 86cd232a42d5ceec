"""NanoGuard's forward pass, every reading of one text at once (the fast path of
``injection.py``).

The package's ``Classifier.forward`` reads a batch of equal-length sequences and its attention
masks nothing, so ``injection.py`` used to call it once per reading (the text's window or
windows, then up to 32 passages), each a separate pass of small matrix products. This module
computes the same function with the package's own modules and weights, for all readings of a
text in one pass:

- Every token of every reading is one row of a packed ``(tokens, 512)`` matrix, so each linear
  layer (≈ all the arithmetic) is one product over all of them and no padding is computed.
- Attention alone needs the readings apart: per group of similar lengths the rows are gathered
  into a padded ``(readings, length)`` batch with a key-padding mask (a padded key gets no
  weight, so a reading attends to its own tokens and nothing else), then scattered back.
- Rotary positions restart at 0 for each reading, and pooling is the mean over a reading's
  own tokens, exactly as the package computes them for one unpadded sequence.

It is the same arithmetic in another order: the scores match the reference (one unpadded
forward per reading) to float rounding; ``tests/guardrails/test_injection.py`` holds them to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

#: readings no longer than this share one padded attention batch; longer ones (the 512-token
#: windows) go in a batch of their own, so a passage never pays for a window's length
_SHORT = 64


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The package's ``apply_rotary_emb`` on packed rows: ``x`` is (tokens, heads, head_dim),
    ``cos``/``sin`` are (tokens, 1, head_dim / 2), each row at its own position."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], -1)


class _Group:
    """Where the rows of a group of readings sit in the padded attention batch."""

    def __init__(self, offsets: Sequence[int], lengths: Sequence[int]) -> None:
        longest = max(lengths)
        self.mask = torch.zeros(len(lengths), longest, dtype=torch.bool)
        self.index = torch.zeros(len(lengths), longest, dtype=torch.long)
        for row, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
            self.mask[row, :length] = True
            self.index[row, :length] = torch.arange(offset, offset + length)
        self.rows = self.index[self.mask]
        #: (readings, 1, 1, length) for scaled_dot_product_attention; None when nothing is padded
        self.attend = None if bool(self.mask.all()) else self.mask[:, None, None, :]


def _groups(lengths: Sequence[int]) -> list[_Group]:
    offsets = [0]
    for length in lengths[:-1]:
        offsets.append(offsets[-1] + length)
    short = [i for i, n in enumerate(lengths) if n <= _SHORT]
    long = [i for i, n in enumerate(lengths) if n > _SHORT]
    return [
        _Group([offsets[i] for i in part], [lengths[i] for i in part])
        for part in (long, short)
        if part
    ]


def _attention(
    attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, groups: list[_Group]
) -> torch.Tensor:
    """``BidirectionalAttention.forward`` on packed rows, each reading attending to itself."""
    tokens = x.shape[0]
    heads, head_dim = attn.n_head, attn.head_dim
    q = _norm(_rotate(attn.c_q(x).view(tokens, heads, head_dim), cos, sin))
    k = _norm(_rotate(attn.c_k(x).view(tokens, attn.n_kv_head, head_dim), cos, sin))
    v = attn.c_v(x).view(tokens, attn.n_kv_head, head_dim)
    y = torch.empty_like(q)
    for group in groups:
        # (readings, length, heads, head_dim) → (readings, heads, length, head_dim)
        qg, kg, vg = (t[group.index].transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=group.attend)
        y[group.rows] = out.transpose(1, 2)[group.mask]
    return attn.c_proj(y.reshape(tokens, -1))  # type: ignore[no-any-return]


def readings_logits(model: Any, readings: Sequence[Sequence[int]]) -> torch.Tensor:
    """(readings, classes) logits of NanoGuard's ``Classifier`` for each token sequence, as
    ``model(torch.tensor([reading]))`` gives them one by one, in one pass."""
    if len(readings) == 1:  # nothing to pack: the package's own forward is that pass
        return model(torch.tensor([list(readings[0])]))  # type: ignore[no-any-return]
    lengths = [len(r) for r in readings]
    ids = torch.tensor([token for reading in readings for token in reading])
    positions = torch.cat([torch.arange(n) for n in lengths])
    # the package's buffers are (1, positions, 1, head_dim / 2); one row per token here
    cos = model.cos[0, positions]
    sin = model.sin[0, positions]
    groups = _groups(lengths)
    transformer = model.transformer
    x = _norm(transformer.wte(ids))
    x0 = x
    for i, block in enumerate(transformer.h):
        x = model.resid_lambdas[i] * x + model.x0_lambdas[i] * x0
        x = x + _attention(block.attn, _norm(x), cos, sin, groups)
        x = x + block.mlp(_norm(x))
    x = _norm(x)
    owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pooled = torch.zeros(len(lengths), x.shape[-1], dtype=x.dtype).index_add_(0, owner, x)
    pooled = pooled / torch.tensor(lengths, dtype=x.dtype)[:, None]
    return model.cls_head(model.cls_norm(pooled).float())  # type: ignore[no-any-return]
