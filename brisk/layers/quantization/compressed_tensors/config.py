"""``quantization_config`` of a compressed-tensors checkpoint: groups of quantization arguments, each applied to
the modules its ``targets`` name (minus ``ignore``), stored in the group's ``format``. Each linear layer gets the
scheme of its group; what brisk cannot run exactly is refused at startup, by name."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from brisk.layers.quantization.base_config import LinearMethod, QuantizationConfig
from brisk.layers.quantization.compressed_tensors.schemes import make_linear_method

SUPPORTED_STATUSES = ("compressed", "frozen")  # frozen: quantized values stored unpacked (older llmcompressor)


@dataclass(frozen=True)
class QuantGroup:
    """One ``config_groups`` entry: the argument dicts (``weights``, ``input_activations``) and storage format."""

    name: str
    targets: tuple[str, ...]
    weights: dict | None
    input_activations: dict | None
    format: str


def _matches(pattern: str, name: str) -> bool:
    """A target or ignore entry: ``re:<regex>`` (matched from the start of the module name), the class name
    ``Linear`` (every linear layer), or an exact module name."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == "Linear" or pattern == name


def _match_rank(pattern: str, name: str) -> int | None:
    """compressed-tensors' precedence when several groups target one module: exact name, then regex, then the
    class name. None: no match."""
    if not _matches(pattern, name):
        return None
    return 2 if pattern == "Linear" else 1 if pattern.startswith("re:") else 0


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"

    def __init__(self, groups: list[QuantGroup], ignore: list[str], kv_cache_scheme: dict | None):
        super().__init__()
        self.groups = groups
        self.ignore = ignore
        self.kv_cache_scheme = kv_cache_scheme

    @classmethod
    def from_config(cls, config: dict) -> CompressedTensorsConfig:
        status = config.get("quantization_status", "compressed")
        if status not in SUPPORTED_STATUSES:
            raise ValueError(
                f"compressed-tensors checkpoint with quantization_status {status!r}: brisk loads "
                f"{' or '.join(SUPPORTED_STATUSES)} checkpoints (save with llmcompressor's save_compressed=True)."
            )
        if config.get("sparsity_config"):
            raise ValueError("compressed-tensors sparsity_config (sparse checkpoints) is not supported.")
        if config.get("transform_config"):
            raise ValueError("compressed-tensors transform_config (rotations, e.g. SpinQuant) is not supported.")
        groups = []
        for name, group in (config.get("config_groups") or {}).items():
            fmt = group.get("format") or config.get("format")
            if fmt is None or fmt == "mixed-precision":
                raise ValueError(f"compressed-tensors config group {name!r} names no storage format.")
            if group.get("output_activations"):
                raise ValueError(f"compressed-tensors config group {name!r}: output_activations are not supported.")
            groups.append(
                QuantGroup(name, tuple(group["targets"]), group.get("weights"), group.get("input_activations"), fmt)
            )
        if not groups:
            raise ValueError("compressed-tensors quantization_config has no config_groups.")
        kv_cache_scheme = config.get("kv_cache_scheme")
        return cls(groups, list(config.get("ignore") or []), kv_cache_scheme)

    def _group_of(self, name: str) -> QuantGroup | None:
        """The group that quantizes checkpoint module ``name`` (None: ignored or targeted by none)."""
        if any(_matches(pattern, name) for pattern in self.ignore):
            return None
        best: tuple[int, QuantGroup] | None = None
        for group in self.groups:
            ranks = [r for r in (_match_rank(t, name) for t in group.targets) if r is not None]
            if ranks and (best is None or min(ranks) < best[0]):
                best = (min(ranks), group)
        return None if best is None else best[1]

    def get_quant_method(self, layer: nn.Module, prefix: str) -> LinearMethod | None:
        names = self.checkpoint_names(prefix)
        groups = {name: self._group_of(name) for name in names}
        if len({id(group) for group in groups.values()}) > 1:
            described = ", ".join(f"{n}: {g.name if g else 'not quantized'}" for n, g in groups.items())
            raise ValueError(
                f"compressed-tensors checkpoint quantizes the parts of fused layer {prefix} differently "
                f"({described}); brisk needs one scheme per fused layer."
            )
        group = groups[names[0]]
        if group is None:
            return None
        return make_linear_method(group.weights, group.input_activations, group.format, prefix)
