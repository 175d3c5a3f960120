"""vLLM's ``random`` serving dataset, re-implemented from its idea: each request is a run of consecutive ids from
a random offset (so requests differ and share no prefix by accident), after an optional shared random prefix.

With a tokenizer the ids are decoded to text, re-encoded and fixed up (truncated, or topped up with random ids)
until the text encodes to the intended number of tokens, so the server sees prompts of the intended length. Without
one (or with ``as_token_ids``) the ids themselves are the prompt (``"prompt": [ids]``). Lengths are fixed unless
``range_ratio`` > 0, which draws them from ``[L * (1 - r), L * (1 + r)]`` like vLLM.

The draws use ``numpy.random.default_rng(seed)``: same lengths and structure as vLLM's dataset, not the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_VOCAB = 10000  # ids for token-id prompts without a tokenizer: valid for every real model


@dataclass
class ServeRequest:
    prompt: str | list[int]
    prompt_len: int  # tokens of the prompt, not counting special tokens the server adds (vLLM's prompt_len)
    output_len: int


def _allowed_ids(tokenizer, vocab_size: int | None) -> np.ndarray:
    if tokenizer is None:
        return np.arange(vocab_size or DEFAULT_VOCAB)
    vocab = vocab_size or tokenizer.vocab_size
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return np.array([i for i in range(vocab) if i not in special])


def decode_to_length(tokenizer, ids: list[int], rng, allowed: np.ndarray, tries: int = 10) -> tuple[str, list[int]]:
    """Text that encodes (without special tokens) to ``len(ids)`` tokens where possible, and its encoding."""
    target = len(ids)
    text = tokenizer.decode(ids)
    for _ in range(tries):
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == target:
            return text, encoded
        if len(encoded) > target:
            encoded = encoded[:target]
        else:
            encoded = encoded + allowed[rng.integers(0, len(allowed), target - len(encoded))].tolist()
        text = tokenizer.decode(encoded)
    return text, tokenizer.encode(text, add_special_tokens=False)


def random_requests(
    num_requests: int,
    input_len: int = 1024,
    output_len: int = 128,
    prefix_len: int = 0,
    range_ratio: float = 0.0,
    seed: int = 0,
    tokenizer=None,
    as_token_ids: bool = False,
    vocab_size: int | None = None,
) -> list[ServeRequest]:
    """``num_requests`` prompts of ``prefix_len`` shared + ``input_len`` own tokens, each asking ``output_len``."""
    if num_requests < 1 or input_len < 1 or output_len < 1 or prefix_len < 0:
        raise ValueError("num_requests, input_len and output_len must be >= 1 and prefix_len >= 0.")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}.")
    text = tokenizer is not None and not as_token_ids
    rng = np.random.default_rng(seed)
    allowed = _allowed_ids(tokenizer, vocab_size)
    # Text prompts: the server adds the tokenizer's special tokens (BOS), so leave room for them, as vLLM does.
    specials = tokenizer.num_special_tokens_to_add() if text else 0
    own_len = max(1, input_len - specials)
    prefix = allowed[rng.integers(0, len(allowed), prefix_len)].tolist() if prefix_len else []
    in_lens = rng.integers(int(own_len * (1 - range_ratio)), int(own_len * (1 + range_ratio)) + 1, num_requests)
    out_lens = rng.integers(
        max(1, int(output_len * (1 - range_ratio))), int(output_len * (1 + range_ratio)) + 1, num_requests
    )
    offsets = rng.integers(0, len(allowed), num_requests)
    requests = []
    for i in range(num_requests):
        own = allowed[(offsets[i] + i + np.arange(max(1, int(in_lens[i])))) % len(allowed)].tolist()
        ids = prefix + own
        if text:
            prompt, ids = decode_to_length(tokenizer, ids, rng, allowed)
            requests.append(ServeRequest(prompt, len(ids), int(out_lens[i])))
        else:
            requests.append(ServeRequest(ids, len(ids), int(out_lens[i])))
    return requests
