"""Comparing a loaded brisk model's quantized linear layers with per-checkpoint-module reference weights."""

from __future__ import annotations

from collections.abc import Callable

import torch

from brisk import LLM


def assert_weights_equal(llm: LLM, reference: Callable[[str], torch.Tensor]) -> None:
    """Each linear layer's dequantized weight equals ``reference(name)`` of the checkpoint modules it holds
    (concatenated in fused order: q, k, v and gate, up), bit for bit."""
    for i, layer in enumerate(llm.engine.model_runner.model.model.layers):
        prefix = f"model.layers.{i}."
        parts = {
            layer.self_attn.qkv_proj: ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            layer.self_attn.o_proj: ["self_attn.o_proj"],
            layer.mlp.gate_up_proj: ["mlp.gate_proj", "mlp.up_proj"],
            layer.mlp.down_proj: ["mlp.down_proj"],
        }
        for linear, names in parts.items():
            expected = torch.cat([reference(prefix + name) for name in names])
            assert torch.equal(linear.quant_method.dequantized_weight(linear), expected), linear.prefix
