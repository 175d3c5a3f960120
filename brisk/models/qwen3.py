"""Qwen3: the Llama decoder with per-head RMSNorm on queries and keys before RoPE."""

from brisk.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
