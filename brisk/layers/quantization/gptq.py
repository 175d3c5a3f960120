"""GPTQ checkpoints (``quant_method: gptq``, as gptqmodel and AutoGPTQ save them): 4- or 8-bit weights packed
along the input dimension (``qweight`` [in / pack, out]), zero points packed along the output dimension
(``qzeros`` [groups, out / pack]), ``scales`` [groups, out] and ``g_idx`` [in], the group of each input (with
``desc_act`` the groups follow the activation order, not the input order).

``checkpoint_format`` "gptq" (v1, the default) stores each zero point minus one; "gptq_v2" stores it as is.
On the CPU the weight is dequantized for each matmul, ``(q - zero[g_idx]) * scale[g_idx]`` in float32 (exact).
On CUDA it is repacked once for the Triton kernels (``packed_int.py``; with ``desc_act`` the inputs are sorted
by group)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.distributed.parallel_state import get_tp_size
from brisk.layers.quantization.base_config import QuantizationConfig, add_param, check_group_size
from brisk.layers.quantization.packed_int import kernel_linear, set_kernel_weights, unpack_int32, use_int_kernels

SUPPORTED_BITS = (4, 8)
CHECKPOINT_FORMATS = {"gptq": 1, "gptq_v2": 0}  # format -> offset added to the stored zero points


class GPTQConfig(QuantizationConfig):
    name = "gptq"

    def __init__(self, bits: int, group_size: int, zero_offset: int, dynamic_skips: list[str]):
        super().__init__()
        self.bits = bits
        self.group_size = group_size  # -1: one group over the whole input
        self.zero_offset = zero_offset
        self.dynamic_skips = dynamic_skips

    @classmethod
    def from_config(cls, config: dict) -> GPTQConfig:
        bits = config.get("bits")
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"GPTQ checkpoint with bits={bits}: brisk loads {' or '.join(map(str, SUPPORTED_BITS))}.")
        fmt = config.get("checkpoint_format", "gptq")
        if fmt not in CHECKPOINT_FORMATS:
            raise ValueError(f"GPTQ checkpoint_format {fmt!r} is not supported ({', '.join(CHECKPOINT_FORMATS)}).")
        group_size = config.get("group_size", -1)
        if not isinstance(group_size, int) or (group_size <= 0 and group_size != -1):
            raise ValueError(f"GPTQ checkpoint with group_size={group_size!r}: expected a positive size or -1.")
        dynamic = config.get("dynamic") or {}
        if any(not key.startswith("-:") for key in dynamic):
            raise ValueError("GPTQ per-module overrides (quantization_config.dynamic) are not supported.")
        return cls(bits, group_size, CHECKPOINT_FORMATS[fmt], [key[2:] for key in dynamic])

    def get_quant_method(self, layer: nn.Module, prefix: str) -> GPTQLinearMethod | None:
        import re

        if any(re.match(pattern, name) for name in self.checkpoint_names(prefix) for pattern in self.dynamic_skips):
            return None
        return GPTQLinearMethod(self, prefix)


class GPTQLinearMethod:
    def __init__(self, config: GPTQConfig, prefix: str):
        self.config = config
        self.prefix = prefix

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        """A row-parallel layer (``in_features`` a slice of the inputs) keeps every group's scales and zero
        points and its slice of ``g_idx``: with ``desc_act`` any input of the slice may belong to any group."""
        pack = 32 // self.config.bits
        ranks = get_tp_size() if layer.input_is_parallel else 1
        total_in = in_features * ranks
        group = total_in if self.config.group_size == -1 else self.config.group_size
        if total_in % group:
            raise ValueError(f"GPTQ {self.prefix}: group_size {group} does not divide the input size {total_in}.")
        if in_features % pack or any(size % pack for size in layer.output_partition_sizes):
            raise ValueError(
                f"GPTQ {self.prefix}: sizes per rank must be multiples of {pack} to pack {self.config.bits}-bit "
                f"values (inputs {in_features}, outputs {layer.output_partition_sizes})."
            )
        groups = total_in // group
        add_param(layer, "qweight", torch.empty(in_features // pack, out_features, dtype=torch.int32),
                  input_dim=0, output_dim=1, packed_dim=0, packed_factor=pack)  # fmt: skip
        add_param(layer, "qzeros", torch.empty(groups, out_features // pack, dtype=torch.int32),
                  output_dim=1, packed_dim=1, packed_factor=pack)  # fmt: skip
        add_param(layer, "scales", torch.empty(groups, out_features, dtype=dtype), output_dim=1)
        if layer.input_is_parallel:  # never fused: one g_idx, this rank's slice of it
            add_param(layer, "g_idx", torch.empty(in_features, dtype=torch.int32), input_dim=0)
        else:  # one g_idx per fused part (q, k, v see the same inputs, so GPTQ gives them one order: checked)
            shards = len(layer.output_partition_sizes)
            add_param(layer, "g_idx", torch.empty(shards, in_features, dtype=torch.int32), per_shard=True)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Unpacked once: ``[out, in]`` integers, and per input its group's zero point and scale gathered by
        ``g_idx`` (so activation order costs nothing at run time); on CUDA, the kernels' layout instead."""
        bits, g_idx = self.config.bits, layer.g_idx.data.long().reshape(-1, layer.in_features)
        if not bool((g_idx == g_idx[:1]).all()):
            raise ValueError(f"GPTQ {self.prefix}: the fused parts' g_idx differ; brisk needs one input order.")
        g_idx, groups = g_idx[0], layer.scales.shape[0]
        if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            raise ValueError(f"GPTQ {self.prefix}: g_idx names groups outside 0..{groups - 1}.")
        weight_q = unpack_int32(layer.qweight.data, bits, dim=0).t().contiguous()  # [out, in]
        zeros = unpack_int32(layer.qzeros.data, bits, dim=1) + self.config.zero_offset  # [groups, out]
        self.use_kernel = use_int_kernels(layer.qweight)
        if self.use_kernel:
            # One group (group_size -1) spans each rank's whole slice; else the checkpoint's group size.
            total_in = layer.in_features * (get_tp_size() if layer.input_is_parallel else 1)
            self.group = total_in // groups if groups > 1 else layer.in_features
            self._set_kernel_weights(layer, weight_q, zeros, g_idx)
            return
        layer.weight_q = nn.Parameter(weight_q, requires_grad=False)
        layer.weight_zero = nn.Parameter(zeros[g_idx].t().contiguous(), requires_grad=False)  # [out, in]
        layer.weight_scale = nn.Parameter(layer.scales.data.float()[g_idx].t().contiguous(), requires_grad=False)
        del layer.qweight, layer.qzeros, layer.scales, layer.g_idx

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        return (layer.weight_q - layer.weight_zero).float() * layer.weight_scale

    def _set_kernel_weights(self, layer: nn.Module, weight_q: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor):
        """The kernels read a group as ``group`` consecutive inputs: an activation order sorts the inputs. A
        row-parallel rank keeps the groups its slice holds (whole groups only: with ``desc_act`` the slices split
        them, which the kernels cannot read)."""
        check_group_size(f"GPTQ {self.prefix}", layer, self.group, layer.in_features)
        first = int(g_idx.min()) if g_idx.numel() else 0
        held = layer.in_features // self.group
        in_order = first + torch.arange(layer.in_features, device=g_idx.device) // self.group
        order = None
        if not torch.equal(g_idx, in_order):
            order = torch.sort(g_idx, stable=True).indices
            if not torch.equal(g_idx[order], in_order):
                why = ""
                if layer.input_is_parallel and get_tp_size() > 1:
                    why = (" on this rank: tensor parallelism splits activation-order groups over the ranks; use "
                           "tensor_parallel_size=1 or a checkpoint made with desc_act=False")  # fmt: skip
                raise ValueError(f"GPTQ {self.prefix}: g_idx groups are not all {self.group} inputs long{why}.")
        scales, zeros = layer.scales.data[first : first + held], zeros[first : first + held]
        set_kernel_weights(layer, weight_q, scales.t(), zeros.t(), self.config.bits, self.group, order)
        del layer.qweight, layer.qzeros, layer.scales, layer.g_idx

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.use_kernel:
            return kernel_linear(layer, x, bias, self.config.bits, self.group)
        return F.linear(x, self.dequantized_weight(layer).to(x.dtype), bias)
