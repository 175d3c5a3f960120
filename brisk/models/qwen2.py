"""Qwen2 / Qwen2.5: the Llama decoder with biases on the q/k/v projections."""

from brisk.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
