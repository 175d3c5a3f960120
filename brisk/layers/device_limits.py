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
    """Bytes of shared memory a block may opt in to: torch's figure where it has one (torch 2.6 and newer), else
    the figure Triton checks its kernels against; 0 off a GPU."""
    if device.type != "cuda":
        return 0
    optin = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
    if optin:
        return optin
    from triton.runtime import driver

    index = device.index if device.index is not None else torch.cuda.current_device()
    return driver.active.utils.get_device_properties(index)["max_shared_mem"]
