"""What the Triton launchers' heuristics read about a GPU, cached per device, with stand-ins for Triton's
interpreter on CPU (an H100/H200-sized grid, no large shared memory)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


@functools.cache
def shared_memory_per_block(device: torch.device) -> int:
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
    return 0
