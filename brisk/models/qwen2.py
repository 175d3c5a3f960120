"""Qwen2 / Qwen2.5: the Llama decoder with biases on the q/k/v projections (none on o_proj or the MLP)."""

from brisk.models.llama import LlamaForCausalLM


def qwen_sliding_window(config) -> int | None:
    """Qwen2 and Qwen3 window only the layers ``layer_types`` marks (older transformers: ``use_sliding_window``
    from layer ``max_window_layers`` on)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        windowed = "sliding_attention" in layer_types
    else:
        windowed = bool(getattr(config, "use_sliding_window", False)) and (
            getattr(config, "max_window_layers", 0) < config.num_hidden_layers
        )
    return window if windowed else None


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
    config_attention_bias = False
    config_mlp_bias = False
    sliding_window = staticmethod(qwen_sliding_window)
