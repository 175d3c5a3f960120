"""Mistral: the Llama decoder without biases, whatever the config says (its window is Llama's rule)."""

from brisk.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    config_attention_bias = False
    config_mlp_bias = False
