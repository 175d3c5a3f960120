"""The current step's attention metadata, set by the model runner around each forward pass.

Attention layers read it from here instead of threading it through every model's forward signature.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brisk.layers.attention.backend import AttentionMetadata

_METADATA: AttentionMetadata | None = None


@contextmanager
def set_forward_context(metadata: AttentionMetadata) -> Iterator[None]:
    global _METADATA
    previous, _METADATA = _METADATA, metadata
    try:
        yield
    finally:
        _METADATA = previous


def get_attn_metadata() -> AttentionMetadata:
    if _METADATA is None:
        raise RuntimeError("attention called outside set_forward_context()")
    return _METADATA
