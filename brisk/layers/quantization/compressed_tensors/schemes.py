"""Which linear method runs a compressed-tensors group, from its quantization arguments and storage format, and
the parameter helpers the schemes share."""

from __future__ import annotations

import torch
from torch import nn

from brisk.layers.quantization.base_config import LinearMethod, add_param, replace_param


def unsupported(prefix: str, what: str) -> ValueError:
    return ValueError(f"compressed-tensors scheme of {prefix}: {what} is not supported.")


def make_linear_method(weights: dict | None, inputs: dict | None, fmt: str, prefix: str) -> LinearMethod:
    """The scheme class for ``format`` and the weight/input argument dicts (a ValueError naming what is not
    supported otherwise)."""
    if weights is None:
        raise unsupported(prefix, "a group without weight quantization")
    if weights.get("dynamic"):
        raise unsupported(prefix, "dynamic weight quantization")
    # "weight" (alias "static", llmcompressor GPTQModifier's default) only orders GPTQ's calibration: the groups
    # stay in column order and no g_idx is saved, so the weights load as without it.
    if weights.get("actorder") not in (None, "weight", "static"):
        raise unsupported(prefix, f"weights actorder={weights['actorder']!r} (GPTQ activation order with g_idx)")
    kind, bits = weights.get("type"), weights.get("num_bits")
    if kind == "float" and bits == 8 and fmt in ("float-quantized", "naive-quantized"):
        if weights.get("strategy") == "block":
            from brisk.layers.quantization.compressed_tensors.fp8_block import CompressedTensorsW8A8Fp8Block

            return CompressedTensorsW8A8Fp8Block(weights, inputs, prefix)
        from brisk.layers.quantization.compressed_tensors.fp8 import CompressedTensorsW8A8Fp8

        return CompressedTensorsW8A8Fp8(weights, inputs, prefix)
    if kind == "int" and bits == 8 and fmt in ("int-quantized", "naive-quantized") and inputs is not None:
        from brisk.layers.quantization.compressed_tensors.int8 import CompressedTensorsW8A8Int8

        return CompressedTensorsW8A8Int8(weights, inputs, prefix)
    if kind == "int" and fmt == "pack-quantized" and inputs is None:
        from brisk.layers.quantization.compressed_tensors.wna16 import CompressedTensorsWNA16

        return CompressedTensorsWNA16(weights, prefix)
    if kind == "float" and bits == 4 and fmt == "nvfp4-pack-quantized" and inputs is None:
        from brisk.layers.quantization.compressed_tensors.fp4 import CompressedTensorsNVFP4A16

        return CompressedTensorsNVFP4A16(weights, prefix)
    if kind == "float" and bits == 4 and fmt == "mxfp4-pack-quantized" and inputs is None:
        from brisk.layers.quantization.compressed_tensors.fp4 import CompressedTensorsMXFP4A16

        return CompressedTensorsMXFP4A16(weights, prefix)
    raise unsupported(
        prefix,
        f"format {fmt!r} with {kind} {bits}-bit weights and "
        f"{'no' if inputs is None else str(inputs.get('type')) + ' ' + str(inputs.get('num_bits')) + '-bit'} "
        "input quantization",
    )


def weight_strategy(args: dict, allowed: tuple[str, ...], prefix: str) -> str:
    strategy = args.get("strategy")
    if strategy not in allowed:
        raise unsupported(prefix, f"weights strategy {strategy!r} (supported: {', '.join(allowed)})")
    return strategy


def add_per_shard_scale(layer: nn.Module, name: str) -> nn.Parameter:
    """A per-tensor scale: one float32 per fused projection (q, k, v each have their own)."""
    shards = len(layer.output_partition_sizes)
    return add_param(layer, name, torch.zeros(shards, dtype=torch.float32), per_shard=True)


def per_row(layer: nn.Module, shard_scales: torch.Tensor) -> torch.Tensor:
    """Per-shard scalars as one float32 per output row, shape ``(out_features, 1)``: each fused projection keeps
    its own scale exactly (no requantization to a shared one)."""
    sizes = torch.tensor(layer.output_partition_sizes, device=shard_scales.device)
    return shard_scales.float().repeat_interleave(sizes)[:, None]


class EightBitWeights:
    """What the FP8 and INT8 schemes share: 8-bit weights ``[out, in]`` of ``weight_dtype`` with a scale per
    output channel or per tensor (one per fused part, kept per row), and with ``static_input`` a per-tensor
    input scale (the fused parts share their input: the largest of theirs)."""

    weight_dtype: torch.dtype
    strategy: str
    static_input: bool

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        weight = torch.empty(out_features, in_features, dtype=self.weight_dtype)
        add_param(layer, "weight", weight, output_dim=0, input_dim=1)
        if self.strategy == "channel":
            add_param(layer, "weight_scale", torch.empty(out_features, 1, dtype=torch.float32), output_dim=0)
        else:
            add_per_shard_scale(layer, "weight_scale")
        if self.static_input:
            add_per_shard_scale(layer, "input_scale")

    def process_scales(self, layer: nn.Module) -> None:
        scale = layer.weight_scale.data
        replace_param(layer, "weight_scale", per_row(layer, scale) if self.strategy == "tensor" else scale.float())
        if self.static_input:
            replace_param(layer, "input_scale", layer.input_scale.data.float().amax().reshape(1, 1))
