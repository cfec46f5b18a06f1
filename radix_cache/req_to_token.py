"""The request-to-token table: one row per running request, holding its KV slot per position.

``table[row, i]`` is the slot of the request's token at position ``i``. Attention backends
read a request's K/V through its row; the scheduler writes rows when it grants slots.
"""

from __future__ import annotations

import torch


class ReqToTokenTable:
    """Rows of slot indices, handed out to requests and taken back when they finish.

    Rules:
      - ``alloc()`` returns a free row index, or ``None`` when every row is in use.
      - ``free(row)`` returns a row; freeing a row that is not in use raises ``ValueError``.
      - Row contents are not cleared on free: a row is only meaningful up to the owning
        request's ``seq_len``.
    """

    def __init__(self, max_requests: int, max_context_len: int, device: str | torch.device = "cpu") -> None:
        if not isinstance(max_requests, int) or max_requests < 1:
            raise ValueError(f"max_requests must be a positive integer, got {max_requests!r}")
        if not isinstance(max_context_len, int) or max_context_len < 1:
            raise ValueError(f"max_context_len must be a positive integer, got {max_context_len!r}")
        self.max_requests = max_requests
        self.max_context_len = max_context_len
        self.table = torch.zeros((max_requests, max_context_len), dtype=torch.int64, device=device)
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self._in_use = [False] * max_requests

    @property
    def available(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._in_use[row] = True
        return row

    def free(self, row: int) -> None:
        if not 0 <= row < self.max_requests or not self._in_use[row]:
            raise ValueError(f"request row {row} is not in use")
        self._in_use[row] = False
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record ``slots`` as the KV slots of positions ``start .. start+len(slots)`` of ``row``."""
        end = start + slots.numel()
        if end > self.max_context_len:
            raise ValueError(f"position {end} exceeds max_context_len {self.max_context_len}")
        self.table[row, start:end] = slots.to(self.table.device)

    def read(self, row: int, end: int, start: int = 0) -> torch.Tensor:
        return self.table[row, start:end]

    def reset(self) -> None:
        self.__init__(self.max_requests, self.max_context_len, self.table.device)  # type: ignore[misc]
