"""Rebuild a Hugging Face tokenizer from the vocabulary stored in a GGUF file.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are supported: that is what
Llama-3, SmolLM, Qwen2 and most recent models use. The pre-tokenizer (how text is split into words
before BPE) is not stored in the file, only named by ``tokenizer.ggml.pre``; we map the names to the
splitting rules of the original ``tokenizer.json`` (the same regexes as llama.cpp's ``llama-vocab.cpp``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

# Token types of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> family. Aliases follow llama.cpp's llama-vocab.cpp.
_PRE_FAMILIES = {
    "smollm": "digits+gpt2",
    "starcoder": "digits+gpt2",
    "refact": "digits+gpt2",
    "codeshell": "digits+gpt2",
    "qwen2": "qwen2",
    "qwen2.5": "qwen2",
    "qwen-2.5": "qwen2",
    "deepseek-r1-qwen": "qwen2",
    "stablelm2": "qwen2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "default": "gpt2",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "llama-v3": "llama3",
}
SUPPORTED_PRE_TOKENIZERS = tuple(sorted(_PRE_FAMILIES))

# Texts that llama.cpp treats as end-of-generation when they are control tokens.
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>")


def _pre_tokenizer(pre: str) -> tuple[Any, Any]:
    """(normalizer, pre_tokenizer) matching the original tokenizer.json of the family."""
    family = _PRE_FAMILIES.get(pre)
    if family is None:
        raise ValueError(
            f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)})"
        )
    if family == "digits+gpt2":  # SmolLM / StarCoder: single digits, then GPT-2's byte-level regex
        return None, pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    if family == "gpt2":
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    regex = _QWEN2_REGEX if family == "qwen2" else _LLAMA3_REGEX
    split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    normalizer = normalizers.NFC() if family == "qwen2" else None
    return normalizer, pre_tokenizers.Sequence([split, byte_level])


def adds_bos(fields: dict[str, Any]) -> bool:
    """``tokenizer.ggml.add_bos_token``; when absent, llama.cpp's default for the family (Llama 3 adds BOS)."""
    value = fields.get("tokenizer.ggml.add_bos_token")
    if value is None:
        return _PRE_FAMILIES.get(fields.get("tokenizer.ggml.pre", "default")) == "llama3"
    return bool(value)


def _token(fields: dict[str, Any], key: str) -> str | None:
    tokens = fields["tokenizer.ggml.tokens"]
    v = fields.get(f"tokenizer.ggml.{key}")
    if v is None or not 0 <= int(v) < len(tokens):
        return None
    return tokens[int(v)]


def eos_token_ids(fields: dict[str, Any]) -> list[int]:
    """End-of-generation ids: the GGUF's eos first, then eot/eom and ChatML-style control tokens."""
    tokens = fields.get("tokenizer.ggml.tokens") or []
    types = fields.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        v = fields.get(f"tokenizer.ggml.{key}")
        if v is not None and 0 <= int(v) < len(tokens) and int(v) not in ids:
            ids.append(int(v))
    for i, (text, typ) in enumerate(zip(tokens, types, strict=False)):
        if typ == TOKEN_CONTROL and text in _EOG_TEXTS and i not in ids:
            ids.append(i)
    return ids


def build_tokenizer_object(fields: dict[str, Any]) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` equivalent to the GGUF's vocabulary (byte-level BPE only)."""
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"GGUF tokenizer model {model!r} is not supported: only byte-level BPE ('gpt2') vocabularies are"
        )
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    merges_raw: list[str] = fields.get("tokenizer.ggml.merges") or []
    if len(types) != len(tokens):
        raise ValueError(f"GGUF has {len(tokens)} tokens but {len(types)} token types")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # on duplicate texts keep the first id, as tokenizer.json would
    merges = []
    for m in merges_raw:
        pos = m.find(" ", 1)  # same split as llama.cpp: a token never starts with the separator space
        if pos < 0:
            raise ValueError(f"malformed BPE merge {m!r} in GGUF")
        merges.append((m[:pos], m[pos + 1 :]))
    pre_name = fields.get("tokenizer.ggml.pre", "default")
    # Llama 3 looks a whole pre-token up in the vocabulary before merging (its tokenizer.json's ignore_merges).
    ignore_merges = _PRE_FAMILIES.get(pre_name) == "llama3"
    bpe = models.BPE(
        vocab=vocab, merges=merges, dropout=None, fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges
    )
    tok = Tokenizer(bpe)
    normalizer, pre = _pre_tokenizer(pre_name)
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    bos = _token(fields, "bos_token_id")
    add_bos = adds_bos(fields) and bos is not None
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False)) and _token(fields, "eos_token_id")
    if add_bos or add_eos:
        eos = _token(fields, "eos_token_id")
        single = " ".join(([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else []))
        pair = (
            single
            + " "
            + " ".join(([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else []))
        )
        special = [(t, vocab[t]) for t in {bos if add_bos else None, eos if add_eos else None} if t]
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(single=single, pair=pair, special_tokens=special),
            ]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = []
    for i, (t, typ) in enumerate(zip(tokens, types, strict=True)):
        if typ in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and vocab.get(t) == i:
            added.append(
                AddedToken(
                    t,
                    special=typ == TOKEN_CONTROL,
                    normalized=False,
                    single_word=False,
                    lstrip=False,
                    rstrip=False,
                )
            )
    # add_tokens keeps the ids these texts already have in the vocabulary.
    tok.add_tokens(added)
    return tok


def _special_tokens(fields: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("pad_token", "padding_token_id"),
        ("unk_token", "unknown_token_id"),
    ):
        text = _token(fields, key)
        if text is not None:
            out[name] = text
    return out


def save_tokenizer(fields: dict[str, Any], out_dir: str | os.PathLike) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``out_dir``.

    The files are what ``PreTrainedTokenizerFast.save_pretrained`` writes (loadable with
    ``AutoTokenizer.from_pretrained`` on transformers 4 and 5), written directly so that converting does
    not need to import transformers.
    """
    out = Path(out_dir)
    tok = build_tokenizer_object(fields)
    tok.save(str(out / "tokenizer.json"))
    specials = _special_tokens(fields)
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }
    cfg: dict[str, Any] = {
        "add_bos_token": adds_bos(fields),
        "add_eos_token": bool(fields.get("tokenizer.ggml.add_eos_token", False)),
        "added_tokens_decoder": added,
        **specials,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    arch = fields.get("general.architecture")
    ctx = fields.get(f"{arch}.context_length") if arch else None
    if ctx:
        cfg["model_max_length"] = int(ctx)
    template = fields.get("tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, ensure_ascii=False) + "\n")
