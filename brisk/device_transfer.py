"""Host-to-device transfers shared by the layers and the worker."""

from __future__ import annotations

import torch


def to_device_async(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on the device without blocking the host (pinned staging memory on GPUs)."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
