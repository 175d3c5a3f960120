"""Activations of gated MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.fused import fused_ops_for


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` over the fused gate_up projection's two halves."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = fused_ops_for(x)
        if fused is not None:
            return fused.silu_and_mul(x)
        return self._reference(x)

    @staticmethod
    def _reference(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
