"""Loading a tokenizer and shaping chat messages for its template, for the engine, ``LLM.chat`` and the server's
HTTP side alike (this module imports nothing heavy)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger(__name__)

# Arguments of transformers' apply_chat_template that the callers set themselves: chat_template_kwargs may not.
RESERVED_CHAT_TEMPLATE_KWARGS = frozenset(
    {"conversation", "chat_template", "tokenize", "tools", "add_generation_prompt", "continue_final_message"}
)

# Python's interpreter-lock switch interval while a tokenizer loads on its thread (the default is 5 ms): the import
# of transformers is Python work, and the thread beside it, which lets the lock go at every file read and device
# wait, would otherwise wait up to 5 ms to get it back each time. On 2 CPU cores, a 1.5B-shape start whose import
# compiles transformers' sources took 7.8-10.1 s with it, 10.6-11.3 s without, 10.2-10.5 s loading in series.
LOADING_SWITCH_INTERVAL_S = 0.0002
LOADING_THREAD_NAME = "brisk-tokenizer-load"

# Files one of which every tokenizer folder holds (fast, sentencepiece, BPE vocabulary, tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def _missing_tokenizer(path) -> str | None:
    """Why ``path``, a local folder, holds no tokenizer (None when it holds a tokenizer file or names a hub repo):
    found out without importing transformers."""
    folder = os.path.expanduser(str(path))
    if os.path.isdir(folder):
        has_file = any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES)
        return None if has_file else f"it holds none of {', '.join(TOKENIZER_FILES)}"
    return "no such folder" if os.path.isabs(folder) or folder.startswith(".") else None


def load_tokenizer(path, optional: bool = False, trust_remote_code: bool = False, use_snapshot: bool = False):
    """The tokenizer at ``path``; an error that names it, or None with a warning when ``optional``.

    A local folder that holds no tokenizer file (a named shape with random weights) is not handed to
    transformers' ``AutoTokenizer``, which would first import its model-config modules (2 to 10 s of start-up,
    most of that phase on a GPU host) only to fail. With ``use_snapshot`` (the engine's encode and decode), a
    snapshot of the tokenizer stands in for it without importing transformers: one saved by an earlier start, or
    else one a child process saves now, loading the tokenizer through transformers on another core while this
    process starts (``tokenizer_snapshot.py``); where none can be saved, the tokenizer loads here."""
    missing = _missing_tokenizer(path)
    if missing is not None:
        if optional:
            logger.warning("no tokenizer files in %s: only token-id prompts will work", path)
            return None
        raise ValueError(f"Cannot load a tokenizer from {path}: {missing}")
    if use_snapshot and not trust_remote_code:
        from brisk.engine.tokenizer_snapshot import snapshot_tokenizer

        snapshot = snapshot_tokenizer(path, lambda: load_tokenizer(path))
        if snapshot is not None:
            return snapshot
    try:
        return load_with_transformers(path, trust_remote_code)
    except Exception as exc:  # the tokenizers library raises a bare Exception for a corrupt tokenizer.json
        if optional:
            logger.warning("no tokenizer in %s (%s): only token-id prompts will work", path, exc)
            return None
        raise ValueError(f"Cannot load a tokenizer from {path}: {exc}") from exc


def load_with_transformers(path, trust_remote_code: bool = False):
    """transformers' ``AutoTokenizer`` load of ``path`` (its errors as they are)."""
    from transformers import AutoTokenizer

    config = None if trust_remote_code else _class_choice_config(path)
    if config is not None:
        return AutoTokenizer.from_pretrained(path, config=config)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def _class_choice_config(path) -> object | None:
    """What ``AutoTokenizer`` reads of the model's config to choose a tokenizer class (its ``model_type``, its
    path, its ``tokenizer_class``), taken from the folder's JSON files; None where the choice may read more.

    Without it, ``AutoTokenizer`` loads the config through ``AutoConfig``, whose model config module imports
    ``torch.distributed.tensor`` and sympy on transformers 5: 1.4 s of a 2.6 s load on a 2-core CPU, and held by
    the interpreter lock beside the engine's start-up. The choice is the same where the tokenizer config names
    its class and neither file ships code (``auto_map``): every branch taken then reads only those three fields
    (tests/engine/test_tokenizer_loading.py compares the two loads)."""
    folder = os.path.expanduser(str(path))
    tokenizer_fields = _json_object(os.path.join(folder, "tokenizer_config.json"))
    model_fields = _json_object(os.path.join(folder, "config.json"))
    if tokenizer_fields is None or model_fields is None or "auto_map" in tokenizer_fields or "auto_map" in model_fields:
        return None
    model_type, tokenizer_class = model_fields.get("model_type"), tokenizer_fields.get("tokenizer_class")
    if not (isinstance(model_type, str) and model_type and isinstance(tokenizer_class, str)):
        return None
    from transformers import PretrainedConfig

    config = PretrainedConfig(tokenizer_class=model_fields.get("tokenizer_class"))
    config.model_type = model_type
    config._name_or_path = str(path)
    return config


def _json_object(file: str) -> dict | None:
    """The JSON object in ``file``; None where it is missing or holds something else."""
    try:
        with open(file, encoding="utf-8") as handle:
            fields = json.load(handle)
    except (OSError, ValueError):
        return None
    return fields if isinstance(fields, dict) else None


def load_tokenizer_in_background(
    path, optional: bool = False, trust_remote_code: bool = False, use_snapshot: bool = False
) -> Future:
    """:func:`load_tokenizer` on a thread; the future holds the tokenizer or the error.

    Loading a tokenizer imports transformers, seconds of start-up that need nothing but the tokenizer's files, so
    the engine loads its weights and builds its KV cache meanwhile, with the interpreter lock changing hands every
    ``LOADING_SWITCH_INTERVAL_S`` until the load ends (the import holds the lock; docs/gpu.md). A required
    tokenizer whose local folder is missing, or holds no tokenizer file, is an error at once, not after the
    weights."""
    missing = _missing_tokenizer(path)
    if missing is not None and not optional:
        raise ValueError(f"Cannot load a tokenizer from {path}: {missing}")
    future: Future = Future()

    def load() -> None:
        try:
            tokenizer = load_tokenizer(path, optional, trust_remote_code, use_snapshot)
            error = None
        except BaseException as exc:  # raised again by future.result() in the caller's thread
            tokenizer, error = None, exc
        _switch_interval.end()  # before the caller can see the result
        if error is None:
            future.set_result(tokenizer)
        else:
            future.set_exception(error)

    _switch_interval.begin()
    threading.Thread(target=load, name=LOADING_THREAD_NAME, daemon=True).start()
    return future


class _LoadingSwitchInterval:
    """``LOADING_SWITCH_INTERVAL_S`` while any tokenizer loads on a thread; the interval from before the first of
    overlapping loads comes back when the last one ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loading = 0
        self._before = sys.getswitchinterval()

    def begin(self) -> None:
        with self._lock:
            if not self._loading:
                self._before = sys.getswitchinterval()
                sys.setswitchinterval(min(self._before, LOADING_SWITCH_INTERVAL_S))
            self._loading += 1

    def end(self) -> None:
        with self._lock:
            self._loading -= 1
            if not self._loading:
                sys.setswitchinterval(self._before)


_switch_interval = _LoadingSwitchInterval()


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style chat message as chat templates take it (vLLM renders them so): ``developer`` as
    ``system``, and tool calls' JSON-string arguments as objects, which templates serialize themselves."""
    entry = dict(message)
    if entry.get("role") == "developer":
        entry["role"] = "system"
    calls = entry.get("tool_calls")
    if isinstance(calls, list):
        entry["tool_calls"] = [_call_with_object_arguments(call) for call in calls]
    return entry


def _call_with_object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}
