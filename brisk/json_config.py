"""A model folder's ``config.json`` read without transformers, for the architectures brisk implements itself.

Importing transformers takes 2 s on a fast machine and 8 to 12 s on a GPU host (it indexes the sources of every
model it knows at import), which was most of brisk's start-up: the engine needs a model's shape before anything
else can begin. For the families brisk runs natively the config is plain data, so it is read here as transformers
would read it: the JSON's fields as attributes, each missing field given its transformers default, and the few
fields transformers derives (``head_dim``, Qwen's windowed layers) derived the same way. Anything else (another
``model_type``, a config with its own code in ``auto_map``) goes through transformers' ``AutoConfig``.
``tests/test_json_config.py`` holds these defaults against transformers' own config classes.
"""

from __future__ import annotations

from typing import Any

_COMMON_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "architectures": None,
}
_LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,  # then num_attention_heads
    "head_dim": None,  # then hidden_size // num_attention_heads
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_QWEN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 4096,  # only when use_sliding_window
    "max_window_layers": 28,
    "layer_types": None,  # then derived from the three above
    "bos_token_id": None,
    "eos_token_id": None,
}
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON_DEFAULTS, **_LLAMA_DEFAULTS, "attention_bias": False, "mlp_bias": False},
    "mistral": {
        **_COMMON_DEFAULTS,
        **_LLAMA_DEFAULTS,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "sliding_window": 4096,
    },
    "qwen2": {**_COMMON_DEFAULTS, **_QWEN_DEFAULTS},
    "qwen3": {**_COMMON_DEFAULTS, **_QWEN_DEFAULTS, "head_dim": 128, "attention_bias": False},
}


class JsonConfig:
    """A config.json's fields as attributes (what brisk's models read of transformers' config objects)."""

    def __init__(self, fields: dict[str, Any]):
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"JsonConfig(model_type={self.__dict__.get('model_type')!r})"


def reads_without_transformers(fields: dict[str, Any], trust_remote_code: bool) -> bool:
    """Whether :func:`json_config` reads this config: a family in FAMILY_DEFAULTS, and no code of its own to run
    (``auto_map`` under ``trust_remote_code`` names a config class that transformers must load)."""
    return fields.get("model_type") in FAMILY_DEFAULTS and not (trust_remote_code and "auto_map" in fields)


def json_config(fields: dict[str, Any]) -> JsonConfig:
    """The config of a family in FAMILY_DEFAULTS, with transformers' defaults and derived fields."""
    config = {**FAMILY_DEFAULTS[fields["model_type"]], **fields}
    scaling = config["rope_scaling"]
    if scaling:  # transformers takes rope_scaling over rope_parameters, and a llama3 scaling's missing original
        # length from max_position_embeddings
        config.pop("rope_parameters", None)
        if scaling.get("rope_type", scaling.get("type")) == "llama3":
            config["rope_scaling"] = {"original_max_position_embeddings": config["max_position_embeddings"], **scaling}
    if config.get("num_key_value_heads") is None:
        config["num_key_value_heads"] = config["num_attention_heads"]
    if "head_dim" in config and config["head_dim"] is None:
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    if config["model_type"] in ("qwen2", "qwen3"):  # a window only when asked for, from layer max_window_layers on
        if not config["use_sliding_window"]:
            config["sliding_window"] = None
        if config["layer_types"] is None:
            config["layer_types"] = [
                "sliding_attention"
                if config["sliding_window"] is not None and i >= config["max_window_layers"]
                else "full_attention"
                for i in range(config["num_hidden_layers"])
            ]
    return JsonConfig(config)
