"""Rotary position embeddings (rotate-half layout, as HF checkpoints store Q/K), with llama3 frequency scaling."""

from __future__ import annotations

import math

import torch
from torch import nn

from brisk.layers.fused import fused_ops_for


def rope_parameters(hf_config) -> dict:
    """Rope settings from either transformers 5 (``rope_parameters``) or 4 (``rope_theta`` + ``rope_scaling``)."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params["type"]
    params.setdefault("rope_type", "default")
    return params


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputes cos/sin for every position up to ``max_position`` and applies them by position index."""

    def __init__(self, head_size: int, max_position: int, params: dict):
        super().__init__()
        rope_type = params["rope_type"]
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_type {rope_type!r} is not supported yet (supported: default, llama3).")
        base = float(params["rope_theta"])
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size))
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, params)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query``: [tokens, heads, head_size]; ``key``: [tokens, kv_heads, head_size]."""
        fused = fused_ops_for(query)
        if fused is not None:
            return fused.apply_rotary(positions, query, key, self.cos, self.sin)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)
