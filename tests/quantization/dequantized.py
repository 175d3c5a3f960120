"""Comparing a loaded brisk model's quantized linear layers with per-checkpoint-module reference weights."""

from __future__ import annotations

from collections.abc import Callable

import torch

from brisk import LLM, SamplingParams


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


def model_with_weights(base: str, weights: dict[str, torch.Tensor]):
    """transformers' float32 model of ``base`` with each module in ``weights`` given that weight."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    state = model.state_dict()
    for name, weight in weights.items():
        state[f"{name}.weight"].copy_(weight)
    return model


def reference_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int = 10) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, alone."""
    tokens = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        tokens.append(model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)[0, ids.shape[1] :].tolist())
    return tokens


def brisk_greedy(llm: LLM, prompts: list[str], max_tokens: int = 10) -> list[list[int]]:
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]
