"""Input checks shared by the cache's public methods: bad input fails loudly, with names."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def as_token_array(token_ids: object, name: str = "token_ids") -> np.ndarray:
    """A 1-D int64 numpy copy of ``token_ids`` (list, tuple, numpy array or tensor)."""
    if isinstance(token_ids, torch.Tensor):
        arr = token_ids.detach().cpu().numpy()
    elif isinstance(token_ids, np.ndarray):
        arr = token_ids
    elif isinstance(token_ids, Sequence) and not isinstance(token_ids, (str, bytes)):
        # Check each distinct element type once: a per-element isinstance loop costs ~0.1 us
        # a token, most of a match's time on a long list prompt.
        types = set(map(type, token_ids))
        if not all(issubclass(t, (int, np.integer)) and not issubclass(t, bool) for t in types):
            raise ValueError(f"{name} must contain only integers")
        arr = np.asarray(token_ids, dtype=np.int64)
    else:
        raise ValueError(f"{name} must be a 1-D integer sequence, got {type(token_ids).__name__}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must have an integer dtype, got {arr.dtype}")
    return np.array(arr, dtype=np.int64, copy=True)


def as_index_tensor(indices: object, name: str = "indices") -> torch.Tensor:
    """A 1-D int64 CPU tensor view of slot ``indices``."""
    if isinstance(indices, torch.Tensor):
        t = indices
    elif isinstance(indices, (np.ndarray, Sequence)) and not isinstance(indices, (str, bytes)):
        try:
            t = torch.as_tensor(np.asarray(indices))
        except (TypeError, ValueError) as e:  # strings, None, ragged lists
            raise ValueError(f"{name} must be a 1-D integer sequence: {e}") from None
    else:
        raise ValueError(f"{name} must be a 1-D integer tensor, got {type(indices).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.numel() and (t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex()):
        raise ValueError(f"{name} must have an integer dtype, got {t.dtype}")
    return t.to(dtype=torch.int64, device="cpu")
