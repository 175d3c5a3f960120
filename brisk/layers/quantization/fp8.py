"""``quant_method: "fp8"``: ``quantization="fp8"`` on a bf16/fp16/fp32 checkpoint, where each linear layer's weight
is quantized to FP8 once it is loaded (a float32 scale per output channel) and its input per token at run time;
or a checkpoint that holds FP8 weights (``Fp8Config``).

Under tensor parallelism each weight row keeps the scale it has on one rank (a row-parallel layer's ranks agree
on the row's largest magnitude), so every rank's FP8 weights are a slice of the single-rank ones. The inputs of
a row-parallel layer are quantized per token over this rank's slice of them, as vLLM does: one scale per
(token, rank) is finer than one per token, and agreeing on it would cost a collective per layer and step."""

from __future__ import annotations

import re

import torch
from torch import nn

from brisk.distributed.parallel_state import tensor_model_parallel_all_reduce
from brisk.layers.linear import set_weight_attrs
from brisk.layers.quantization.base_config import LinearMethod, QuantizationConfig
from brisk.layers.quantization.block_fp8 import BlockFp8LinearMethod, block_shape
from brisk.layers.quantization.compressed_tensors.fp8 import CompressedTensorsW8A8Fp8
from brisk.layers.quantization.fp8_utils import fp8_linear, has_fp8_tensor_cores, quantize_fp8_per_row, row_amax


class Fp8Config(QuantizationConfig):
    """``fp8``. The flag alone quantizes a bf16/fp16/fp32 checkpoint while loading. A checkpoint whose
    ``quantization_config`` says ``fp8`` holds FP8 weights: with ``weight_block_size``, a scale per block
    (transformers' FineGrainedFP8 layout, ``block_fp8.py``); without, one per tensor (AutoFP8's and vLLM's layout:
    ``weight_scale``, and with ``activation_scheme: "static"`` an ``input_scale``; transformers' names them
    ``weight_scale_inv`` and ``activation_scale``), computed as compressed-tensors' FP8 with per-tensor scales is."""

    name = "fp8"

    def __init__(
        self,
        activation_scheme: str | None = None,
        weight_block_size: tuple[int, int] | None = None,
        modules_to_not_convert: tuple[str, ...] = (),
        transformers_names: bool = False,
    ):
        super().__init__()
        self.activation_scheme = activation_scheme  # None: quantize while loading
        self.weight_block_size = weight_block_size
        self.modules_to_not_convert = modules_to_not_convert
        self.transformers_names = transformers_names

    @classmethod
    def from_config(cls, config: dict) -> Fp8Config:
        if not config:  # the flag alone
            return cls()
        if config.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"quantization_config fmt {config['fmt']!r}: FP8 weights must be e4m3.")
        scheme = config.get("activation_scheme", "dynamic")
        if scheme not in ("static", "dynamic"):
            raise ValueError(f"quantization_config activation_scheme {scheme!r}: expected 'static' or 'dynamic'.")
        _check_kv_cache_scheme(config.get("kv_cache_scheme"))
        # AutoFP8 and vLLM name the layers they leave alone ignored_layers, transformers modules_to_not_convert.
        skipped = (*(config.get("ignored_layers") or ()), *(config.get("modules_to_not_convert") or ()))
        _check_modules_to_convert(tuple(config.get("modules_to_convert") or ()), skipped)
        block = config.get("weight_block_size")
        if block is None:
            # transformers writes weight_block_size (null for per-tensor scales) and its own tensor names; AutoFP8
            # and vLLM do not write the field.
            return cls(scheme, None, skipped, transformers_names="weight_block_size" in config)
        shape = block_shape(block)
        if shape is None:
            raise ValueError(f"quantization_config weight_block_size must be two positive integers, got {block!r}.")
        if scheme != "dynamic":
            raise ValueError(
                f"quantization_config activation_scheme {scheme!r}: block-wise FP8 checkpoints are supported with "
                "activation_scheme 'dynamic' only."
            )
        return cls(scheme, shape, skipped)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> LinearMethod | None:
        if self.activation_scheme is None:
            return Fp8OnlineLinearMethod()
        names = self.checkpoint_names(prefix)
        kept = {name: _named_in(name, self.modules_to_not_convert) for name in names}
        if len(set(kept.values())) > 1:
            raise ValueError(
                f"FP8 checkpoint leaves some parts of fused layer {prefix} unquantized "
                f"({list(self.modules_to_not_convert)}); brisk needs the parts alike."
            )
        if kept[names[0]]:
            return None
        if self.weight_block_size is not None:
            return BlockFp8LinearMethod(self.weight_block_size, prefix)
        dynamic = self.activation_scheme == "dynamic"
        inputs = {"type": "float", "num_bits": 8, "dynamic": dynamic, "strategy": "token" if dynamic else "tensor"}
        method = PerTensorFp8UnderTransformersNames if self.transformers_names else CompressedTensorsW8A8Fp8
        return method({"strategy": "tensor"}, inputs, prefix)


class PerTensorFp8UnderTransformersNames(CompressedTensorsW8A8Fp8):
    """transformers' FineGrainedFP8 without blocks: one scale per tensor, ``weight_scale_inv`` (multiplied) and with
    static activations ``activation_scale``; loaded under those names, then computed with as per-tensor FP8 is."""

    RENAMES = {"weight_scale": "weight_scale_inv", "input_scale": "activation_scale"}

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        super().create_weights(layer, in_features, out_features, dtype)
        self._rename(layer, self.RENAMES)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self._rename(layer, {theirs: ours for ours, theirs in self.RENAMES.items()})
        super().process_weights_after_loading(layer)

    @staticmethod
    def _rename(layer: nn.Module, names: dict[str, str]) -> None:
        for old, new in names.items():
            if old in layer._parameters:
                layer.register_parameter(new, layer._parameters.pop(old))


TOKEN_EMBEDDING = "model.embed_tokens"  # the one embedding table of the (Llama-family) models brisk runs


def _check_kv_cache_scheme(scheme: dict | None) -> None:
    """A KV-cache scheme is a startup error, not silently dropped: brisk's KV cache is FP8 only when
    ``kv_cache_dtype="fp8"`` asks for it, whatever config.json says (compressed-tensors' ``kv_cache_scheme`` is not
    read either; the ``self_attn.k_scale`` / ``v_scale`` tensors such a scheme calibrates load for every format), so
    the error tells the user how to ask for it."""
    if scheme is not None:
        raise ValueError(
            f"quantization_config kv_cache_scheme {scheme!r}: brisk does not take a KV-cache scheme from an 'fp8' "
            "quantization_config. Remove kv_cache_scheme from config.json (or set it to null) and pass "
            "kv_cache_dtype='fp8' (--kv-cache-dtype fp8) for an FP8 KV cache, scaled by the checkpoint's "
            "self_attn.k_scale / v_scale tensors where it has them."
        )


def _check_modules_to_convert(converted: tuple[str, ...], skipped: tuple[str, ...]) -> None:
    """transformers' ``modules_to_convert``: modules quantized besides the linear layers (which are all FP8 but those
    ``modules_to_not_convert`` names; the list does not restrict them), in practice embedding tables, matched by
    name suffix and stored as FP8 with one ``weight_scale`` (its ``FP8Embedding``). brisk's embedding holds plain
    weights, so a checkpoint that quantizes it is refused here rather than failing its load on a tensor with no
    parameter; entries naming linear layers change nothing, as in transformers."""
    if any(TOKEN_EMBEDDING.endswith(entry) for entry in converted) and not _named_in(TOKEN_EMBEDDING, skipped):
        raise ValueError(
            f"quantization_config modules_to_convert {list(converted)} names the embedding table {TOKEN_EMBEDDING}: "
            "transformers stores it in FP8 with a weight_scale (FP8Embedding), which brisk does not load. Save "
            f"{TOKEN_EMBEDDING}.weight dequantized (its values times weight_scale, in the model's dtype, without "
            "weight_scale) and remove it from modules_to_convert."
        )


def _named_in(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether checkpoint module ``name`` is one that a ``modules_to_not_convert`` / ``ignored_layers`` entry names,
    read as transformers reads them: a regular expression matched from the start of the name up to the end of a
    module name ("model.layers.1" is not layer 11), or a suffix of the name ("down_proj"). vLLM's exact names
    match both ways."""
    return any(re.match(f"(?:{pattern})(?:\\.|$)", name) or name.endswith(pattern) for pattern in patterns)


class Fp8OnlineLinearMethod:
    """Loads the checkpoint's weight as is, then keeps only its FP8 form (per-output-channel scales). The GEMM
    quantizes the input per token: ``torch._scaled_mm`` on GPUs with FP8 tensor cores above 16 rows (up to 16,
    weight-only FP8 GEMVs that leave the input unquantized); on other GPUs the weight is dequantized for each
    call (weight-only FP8); on the CPU the FP8 arithmetic is emulated exactly."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        layer.weight = set_weight_attrs(weight, output_dim=0, input_dim=1)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        amax = row_amax(layer.weight.data)
        if layer.input_is_parallel:  # this rank holds part of each row: scale by the whole row, as one rank would
            amax = tensor_model_parallel_all_reduce(amax, op="max")
        qweight, scale = quantize_fp8_per_row(layer.weight.data, amax)
        layer.weight = nn.Parameter(qweight, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)
        self.native = has_fp8_tensor_cores(qweight.device)
        self.fp8_gemv = self.native  # batch-1 decode through the (fused) weight-only FP8 GEMV
        self.fp8_per_token_input = self.native  # more rows: inputs in FP8 per token (fused_linear may write them)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.is_cuda and not self.native:  # weight-only FP8 on GPUs without FP8 tensor cores
            weight = layer.weight.to(x.dtype) * layer.weight_scale.to(x.dtype)
            return torch.nn.functional.linear(x, weight, bias)
        return fp8_linear(x, layer.weight, layer.weight_scale, bias, None, self.native)
