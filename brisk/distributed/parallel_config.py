"""Checks that a model's shapes split over the requested ranks, made from its config before any worker process
starts (a wrong size must fail in a second with the numbers, not after every rank has loaded weights)."""

from __future__ import annotations


def check_parallel_shapes(hf_config, tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    problems = []
    if heads % tp:
        problems.append(f"num_attention_heads={heads} is not divisible by tensor_parallel_size={tp}")
    if (kv_heads % tp) if kv_heads >= tp else (tp % kv_heads):
        problems.append(
            f"num_key_value_heads={kv_heads} and tensor_parallel_size={tp}: one must divide the other "
            "(KV heads are split across ranks, or replicated when there are fewer of them)"
        )
    intermediate = getattr(hf_config, "intermediate_size", None)
    if intermediate is not None and intermediate % tp:
        problems.append(f"intermediate_size={intermediate} is not divisible by tensor_parallel_size={tp}")
    layers = hf_config.num_hidden_layers
    if pp > layers:
        problems.append(f"pipeline_parallel_size={pp} is larger than the model's {layers} layers")
    if problems:
        raise ValueError("This model cannot be split as asked: " + "; ".join(problems) + ".")


def check_device_count(world_size: int, device_type: str, device_count: int) -> None:
    """One GPU per rank: more ranks than visible GPUs is an error. CPU ranks are processes (no limit)."""
    if device_type == "cuda" and world_size > device_count:
        raise ValueError(
            f"tensor_parallel_size x pipeline_parallel_size = {world_size} ranks need {world_size} GPUs, but "
            f"{device_count} {'is' if device_count == 1 else 'are'} visible (CUDA_VISIBLE_DEVICES)."
        )
