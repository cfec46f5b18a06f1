"""Allowed-token bitmasks (xgrammar's layout: int32 words, bit ``t % 32`` of word ``t // 32``)
and applying them to logits."""

from __future__ import annotations

import torch

_BITS = torch.arange(32, dtype=torch.int32)


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """All tokens allowed (every bit set)."""
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def allowed_tokens(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool ``[vocab_size]``: which tokens one bitmask row allows."""
    bits = (bitmask_row.unsqueeze(-1) >> _BITS) & 1
    return bits.reshape(-1)[:vocab_size].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: ``logits[i, t] = -inf`` where row ``i`` of ``bitmask`` clears bit ``t``."""
    vocab = logits.shape[-1]
    allowed = ((bitmask.unsqueeze(-1) >> _BITS) & 1).reshape(bitmask.shape[0], -1)[:, :vocab].bool()
    logits.masked_fill_(~allowed, float("-inf"))


def clear_bits(bitmask_row: torch.Tensor, token_ids: list[int], vocab_size: int) -> bool:
    """Disallow ``token_ids`` in one bitmask row, in place, unless that leaves no token of
    the vocabulary allowed (bits past ``vocab_size`` in the last word do not count);
    returns whether it did."""
    if not token_ids:
        return False
    trial = bitmask_row.clone()
    one = torch.ones((), dtype=torch.int32)
    for t in token_ids:
        word, bit = divmod(t, 32)
        if word < trial.numel():
            trial[word] &= ~(one << bit)
    if not bool(allowed_tokens(trial, vocab_size).any()):
        return False
    bitmask_row.copy_(trial)
    return True
