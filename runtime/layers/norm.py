from __future__ import annotations

from typing import TYPE_CHECKING, overload

import torch
from torch import nn

if TYPE_CHECKING:
    from runtime.layers import FusedElementwise


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 whatever the weights' dtype (as HF does).

    Called with a ``residual``, it first adds ``x`` to it (the decoder layer's skip
    connection, rounded to the model dtype as HF's add is) and normalises the sum; it returns
    ``(normed, new residual)``. The fused kernel updates ``residual`` in place; the PyTorch
    path returns a new tensor."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    fused_ops: FusedElementwise | None = None  # set by runtime.layers.enable_fused_elementwise

    @overload
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...
    @overload
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.fused_ops is not None:
            if residual is None:
                return self.fused_ops.rms_norm(x, self.weight, self.eps)
            residual = residual.contiguous()
            return self.fused_ops.rms_norm(x, self.weight, self.eps, residual), residual
        if residual is None:
            return self._norm(x)
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)
