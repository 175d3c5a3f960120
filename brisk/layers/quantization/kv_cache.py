"""The FP8 KV cache: keys and values stored as float8_e4m3fn, each divided by its layer's scale (``k_scale``,
``v_scale``: the checkpoint's when it has them, else 1.0, as vLLM defaults) and multiplied back when read."""

from __future__ import annotations

import torch

from brisk.layers.quantization.fp8_utils import FP8_DTYPE, FP8_MAX

KV_CACHE_DTYPES = {"auto": None, "fp8": FP8_DTYPE, "fp8_e4m3": FP8_DTYPE}
DEFAULT_KV_SCALE = 1.0


def resolve_kv_cache_dtype(name: str) -> torch.dtype | None:
    """The cache's torch dtype for ``kv_cache_dtype`` (None: the model's dtype)."""
    return KV_CACHE_DTYPES[name]


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_DTYPE


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Keys or values into FP8 entries (saturating at +-448 in scaled units)."""
    if scale != 1.0:
        x = x.float() / scale
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """FP8 cache entries back to ``dtype`` (the query's)."""
    out = x.to(dtype)
    return out if scale == 1.0 else out * scale
