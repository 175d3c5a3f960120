"""Default sampling parameters from the model creator's ``generation_config.json``, as vLLM applies them.

vLLM's ``generation_config="auto"`` (its default) takes the sampling fields a model's ``generation_config.json``
sets (Llama 3.1 Instruct: temperature 0.6, top-p 0.9; with transformers 5, which vLLM 0.26 requires, every field
written there counts, a ``top_k: 50`` too) as the defaults of every request that leaves them out, offline
(``LLM.generate`` without ``SamplingParams``) and in the server. brisk does the same, so that a request gives what
it gives there; ``"vllm"`` (vLLM's name for it) keeps the neutral defaults, and a folder takes its
``generation_config.json`` instead of the model's."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from brisk.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# The fields vLLM takes, under SamplingParams' names; HF's max_new_tokens becomes max_tokens.
SAMPLING_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
NEUTRAL = "vllm"


def default_sampling_fields(model_path: str | Path, source: str = "auto") -> dict[str, Any]:
    """The non-neutral sampling defaults of ``source``: ``"auto"`` the model folder's ``generation_config.json``
    (none when it has no such file, as a converted GGUF's carries no sampling fields), ``"vllm"`` none, else a
    folder holding a ``generation_config.json`` (an error when it holds none)."""
    if source == NEUTRAL:
        return {}
    folder = Path(model_path) if source == "auto" else Path(source).expanduser()
    if not (folder / "generation_config.json").is_file():
        if source == "auto":
            return {}
        raise ValueError(
            f"generation_config={source!r}: {folder} holds no generation_config.json; give a folder with one, "
            "'auto' (the model's) or 'vllm' (neutral defaults)."
        )
    path = folder / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"Cannot read {path} ({exc}); fix it, or pass generation_config='vllm'.") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object; fix it, or pass generation_config='vllm'.")
    fields = {name: config[name] for name in SAMPLING_FIELDS if config.get(name) is not None}
    if config.get("max_new_tokens") is not None:
        fields["max_tokens"] = config["max_new_tokens"]
    try:  # a bad value is a startup error, not a 400 on requests that never sent the field
        SamplingParams(**fields)
    except ValueError as exc:
        raise ValueError(
            f"{path} recommends sampling values brisk cannot use ({exc}); fix the file, or pass "
            "generation_config='vllm'."
        ) from exc
    if fields:
        logger.warning(
            "Requests that leave them out take these sampling defaults from %s: %s (generation_config='vllm' "
            "keeps the neutral ones).",
            path,
            fields,
        )
    return fields
