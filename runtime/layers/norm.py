from __future__ import annotations

import torch
from torch import nn

from kernels.cpu.elementwise import rms_norm


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 whatever the weights' dtype (as HF does)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    use_cpu_kernels = False  # set by runtime.layers.enable_cpu_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_cpu_kernels:
            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)
