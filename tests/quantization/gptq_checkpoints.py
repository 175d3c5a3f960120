"""GPTQ checkpoints of the tiny test models in the layout gptqmodel saves (its ``TorchQuantLinear`` packing):
round-to-nearest quantization of each group (GPTQ's error feedback changes the values, not the layout), inputs
grouped in a random activation order when ``desc_act``, and the dequantized weights the checkpoint stands for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FUSED_INPUTS = {
    "q_proj": "attn_in",
    "k_proj": "attn_in",
    "v_proj": "attn_in",
    "gate_proj": "mlp_in",
    "up_proj": "mlp_in",
}


def _pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned ``bits``-wide integers packed low bits first, ``32 / bits`` a word, along ``dim``."""
    per_word = 32 // bits
    moved = values.to(torch.int64).movedim(dim, -1).unflatten(-1, (-1, per_word))
    word = sum(moved[..., j] << (bits * j) for j in range(per_word))
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    return word.movedim(-1, dim).contiguous()


def quantize_gptq(weight, bits, group_size, g_idx, sym, zero_offset):
    """(checkpoint tensors, dequantized weight) of one linear layer."""
    maxq = 2**bits - 1
    out_features, in_features = weight.shape
    groups = in_features // group_size
    scales = torch.empty(groups, out_features, dtype=torch.float16)
    zeros = torch.empty(groups, out_features)
    for g in range(groups):
        w = weight[:, g_idx == g]
        lo, hi = w.amin(1).clamp(max=0), w.amax(1).clamp(min=0)
        if sym:
            hi = torch.maximum(lo.abs(), hi)
            scales[g] = (2 * hi / maxq).clamp(min=1e-5).half()
            zeros[g] = (maxq + 1) // 2
        else:
            scales[g] = ((hi - lo) / maxq).clamp(min=1e-5).half()
            zeros[g] = torch.round(-lo / scales[g].float()).clamp(0, maxq)
    s, z = scales.float()[g_idx].t(), zeros[g_idx].t()  # [out, in]
    q = torch.round(weight / s + z).clamp(0, maxq)
    tensors = {
        "qweight": _pack(q.t(), bits, dim=0),
        "qzeros": _pack(zeros - zero_offset, bits, dim=1),
        "scales": scales.contiguous(),
        "g_idx": g_idx.to(torch.int32).contiguous(),
    }
    return tensors, (q - z) * s


def make_gptq_checkpoint(base: str, out: Path, bits: int, group_size: int, desc_act: bool, sym: bool,
                         checkpoint_format: str = "gptq") -> tuple[str, dict[str, torch.Tensor]]:  # fmt: skip
    """The folder, and each quantized layer's dequantized weight by checkpoint module name."""
    shutil.copytree(base, out)
    state = load_file(out / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    orders: dict[tuple[str, str], torch.Tensor] = {}
    dequantized = {}
    for name in sorted(n for n in state if n.endswith("_proj.weight")):
        module = name.removesuffix(".weight")
        weight = state.pop(name)
        in_features = weight.shape[1]
        size = in_features if group_size == -1 else group_size
        layer, leaf = module.rsplit(".", 2)[0], module.rsplit(".", 1)[1]
        key = (layer, FUSED_INPUTS.get(leaf, leaf))  # q/k/v (gate/up) see one input: one activation order
        if key not in orders:
            perm = torch.randperm(in_features, generator=gen) if desc_act else torch.arange(in_features)
            orders[key] = torch.empty(in_features, dtype=torch.long).scatter_(
                0, perm, torch.arange(in_features) // size
            )
        tensors, dequantized[module] = quantize_gptq(
            weight, bits, size, orders[key], sym, 1 if checkpoint_format == "gptq" else 0
        )
        state.update({f"{module}.{k}": v for k, v in tensors.items()})
    save_file(state, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym,
        "checkpoint_format": checkpoint_format,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    return str(out), dequantized
