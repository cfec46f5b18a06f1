"""The request-to-token rows a step reads, mirrored on the GPU.

The scheduler keeps the request-to-token table on the host: it reads slots on every insert
into the radix tree, and a device table would cost a synchronising copy each time. The
attention kernels need the rows on the device, so before each forward the worker copies the
batch's rows, up to the longest sequence, in one gather and one host-to-device copy.

Whole rows rather than only the new slots, because rows change between a request's steps in
ways a delta would miss: after a prefill chunk the request adopts the tree's slots for
tokens the tree already held, and the duplicate slots it drops go back to the allocator.

The mirror is int32 (half the bytes of the host's int64; FlashInfer wants int32 indices)
and has one extra row of zeros: the dummy row that padded CUDA-graph entries read, whose
only slot is the reserved padding slot 0.
"""

from __future__ import annotations

import torch


class DeviceReqToToken:
    def __init__(self, host_table: torch.Tensor, device: str | torch.device) -> None:
        self.host_table = host_table
        self.device = torch.device(device)
        rows, cols = host_table.shape
        self.table = torch.zeros(rows + 1, cols, dtype=torch.int32, device=self.device)
        self.dummy_row = rows

    def sync(self, rows: torch.Tensor, max_seq_len: int) -> None:
        """Copy positions ``[0, max_seq_len)`` of host rows ``rows`` (int64, on the host)."""
        if rows.numel() == 0 or max_seq_len == 0:
            return
        block = self.host_table[rows, :max_seq_len].to(torch.int32)
        if self.device.type == "cuda":
            block = block.pin_memory().to(self.device, non_blocking=True)
            rows = rows.pin_memory().to(self.device, non_blocking=True)
        self.table[rows, :max_seq_len] = block.to(self.device)
