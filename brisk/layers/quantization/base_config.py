"""What every quantization format provides: a config read from ``config.json``'s ``quantization_config`` (or
built from the ``quantization`` flag) that hands each linear layer its ``quant_method``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

import torch
from torch import nn

from brisk.distributed.parallel_state import get_tp_size
from brisk.layers.linear import set_weight_attrs


def add_param(layer: nn.Module, name: str, tensor: torch.Tensor, **attrs) -> nn.Parameter:
    """Register ``tensor`` as parameter ``name``, tagged for the weight loaders (``set_weight_attrs``)."""
    param = set_weight_attrs(nn.Parameter(tensor, requires_grad=False), **attrs)
    layer.register_parameter(name, param)
    return param


def replace_param(layer: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Parameter ``name`` becomes ``tensor`` (the form a method computes with, after loading)."""
    setattr(layer, name, nn.Parameter(tensor, requires_grad=False))


def check_group_size(what: str, layer: nn.Module, group: int, in_features: int) -> None:
    """Groups of ``group`` inputs must tile the ``in_features`` this rank holds (``what`` names the format and
    layer); a row-parallel layer holds a slice of the inputs, so its ranks each need whole groups."""
    if in_features % group == 0:
        return
    size = f"the input size {in_features}"
    ranks = get_tp_size()
    if layer.input_is_parallel and ranks > 1:
        size = (f"the input size {in_features} of each rank ({in_features * ranks} split over "
                f"tensor_parallel_size={ranks}); use fewer ranks or a checkpoint with smaller groups")  # fmt: skip
    raise ValueError(f"{what}: group_size {group} does not divide {size}.")


class LinearMethod(Protocol):
    """The hook ``brisk.layers.linear.LinearBase`` calls: make the parameters (each tagged for its weight loader
    with ``set_weight_attrs``), turn loaded tensors into the form ``apply`` computes with, compute ``x W^T + b``."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None: ...

    def process_weights_after_loading(self, layer: nn.Module) -> None: ...

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...


class QuantizationConfig(ABC):
    """One format's settings. ``name`` is its ``quant_method`` in ``config.json`` (and the ``quantization`` flag)."""

    name: ClassVar[str]
    # fused parameter name -> the checkpoint module names it holds (the model's packed modules), so that a
    # config naming ``q_proj`` (an ignore list, a target) applies to the fused ``qkv_proj``.
    packed_modules: dict[str, list[str]]

    def __init__(self) -> None:
        self.packed_modules = {}

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict) -> QuantizationConfig:
        """Build from ``quantization_config`` (``{}`` when only the flag was given); raise ValueError naming any
        field or scheme this format does not support."""

    @abstractmethod
    def get_quant_method(self, layer: nn.Module, prefix: str) -> LinearMethod | None:
        """The quant method of the linear layer named ``prefix`` (None: plain weights)."""

    def checkpoint_names(self, prefix: str) -> list[str]:
        """The checkpoint module names behind the layer ``prefix`` (several for a fused q/k/v or gate/up)."""
        parent, _, leaf = prefix.rpartition(".")
        parts = self.packed_modules.get(leaf)
        if parts is None:
            return [prefix]
        return [f"{parent}.{part}" if parent else part for part in parts]
