"""The attention layer models use: holds its KV cache tensor and calls the selected backend."""

from __future__ import annotations

import torch
from torch import nn

from brisk.forward_context import get_attn_metadata
from brisk.layers.attention import get_attn_impl_cls
from brisk.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, scale: float, backend: str):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.impl = get_attn_impl_cls(backend)(num_heads, num_kv_heads, head_size, scale)
        self.kv_cache = torch.empty(0)  # bound by the model runner once the cache is allocated

    def load_kv_scale(self, which: str, scale: torch.Tensor) -> None:
        """The checkpoint's ``k_scale`` or ``v_scale`` (``which``: "k" or "v"): what an FP8 cache divides this
        layer's keys or values by (kept as a Python float, so steps read no device value)."""
        if scale.numel() != 1 or not scale.is_floating_point() or not float(scale) > 0:
            raise ValueError(f"a KV-cache scale must be one positive number, got shape {tuple(scale.shape)}")
        setattr(self.impl, f"{which}_scale", float(scale))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotary_emb: RotaryEmbedding | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q, k, v: [tokens, heads, head_size], before RoPE when ``rotary_emb`` is given: the backend applies it
        (the Triton one in the kernel that writes the KV cache). Returns [tokens, heads * head_size]."""
        out = self.impl.forward(q, k, v, self.kv_cache, get_attn_metadata(), rotary_emb, positions)
        return out.flatten(1)
