"""Qwen3: the Llama decoder with per-head RMSNorm on queries and keys before RoPE (no MLP biases)."""

from brisk.models.llama import LlamaForCausalLM
from brisk.models.qwen2 import qwen_sliding_window


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
    config_mlp_bias = False
    sliding_window = staticmethod(qwen_sliding_window)
