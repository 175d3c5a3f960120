"""Attention backends over the paged KV cache, chosen by name."""

from __future__ import annotations

import functools

import torch

from brisk.layers.attention.backend import AttentionImpl, AttentionMetadata

ATTENTION_BACKENDS = ("torch", "triton", "flashinfer")
FP8_KV_BACKENDS = ("torch", "triton")  # backends that read and write an FP8 KV cache (kv_cache_dtype="fp8")


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install (missing driver libraries, ...)
        return False
    return True


def default_backend(device: torch.device) -> str:
    if torch.device(device).type == "cuda" and _triton_available():
        return "triton"
    return "torch"


def get_attn_impl_cls(name: str) -> type[AttentionImpl]:
    if name == "torch":
        from brisk.layers.attention.torch_ref import TorchAttentionImpl

        return TorchAttentionImpl
    if name == "triton":
        from brisk.layers.attention.triton_backend import TritonAttentionImpl

        return TritonAttentionImpl
    if name == "flashinfer":
        try:
            from brisk.layers.attention.flashinfer_backend import FlashInferAttentionImpl
        except ImportError as e:
            raise ValueError(
                f"attention_backend='flashinfer' needs the flashinfer package ({e}); install flashinfer-python, "
                "or choose 'triton' (the default on GPUs)."
            ) from e
        return FlashInferAttentionImpl
    raise ValueError(f"Unknown attention_backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}.")


__all__ = [
    "AttentionImpl",
    "AttentionMetadata",
    "get_attn_impl_cls",
    "default_backend",
    "ATTENTION_BACKENDS",
    "FP8_KV_BACKENDS",
]
