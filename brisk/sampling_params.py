"""How to sample a request's completions. Every field is validated: bad values raise ``ValueError`` naming it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from brisk.structured_outputs import StructuredOutputsParams

_MAX_LOGPROBS = 20
_MAX_N = 128


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k filter
    min_p: float = 0.0
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True
    include_stop_str_in_output: bool = False  # keep the stop string that ended the text
    # Logits processors (vLLM's names): a bias added to chosen tokens' logits (OpenAI's range [-100, 100]), the
    # only tokens that may be sampled, words that may not be generated, and a grammar the output must match.
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.logit_bias, dict):  # JSON keys are strings: {"50256": -100}
            self.logit_bias = {_token_key(k): v for k, v in self.logit_bias.items()} or None
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self.bad_words = list(self.bad_words) if self.bad_words else None
        self._validate()

    def _validate(self) -> None:
        def check(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"SamplingParams.{name} must be {rule}, got {getattr(self, name)!r}.")

        def is_int(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x: object) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # rejects NaN

        check(is_int(self.n) and 1 <= self.n <= _MAX_N, "n", f"an integer in [1, {_MAX_N}]")
        check(is_num(self.temperature) and 0 <= self.temperature <= 100, "temperature", "in [0, 100]")
        check(is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]")
        check(
            is_int(self.top_k) and 0 <= self.top_k < 2**31,
            "top_k",
            "0 or -1 (disabled) or a positive integer below 2**31 (more than the vocabulary keeps every token)",
        )
        check(is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]")
        check(
            self.max_tokens is None or (is_int(self.max_tokens) and self.max_tokens >= 1),
            "max_tokens",
            "a positive integer or None",
        )
        check(is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "a non-negative integer")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})."
            )
        check(all(isinstance(s, str) and s for s in self.stop), "stop", "a list of non-empty strings")
        check(
            all(is_int(t) and 0 <= t < 2**31 for t in self.stop_token_ids),
            "stop_token_ids",
            "a list of token ids (non-negative, below 2**31)",
        )
        # The n sequences of a seeded request take seeds seed .. seed + n - 1.
        check(
            self.seed is None or (is_int(self.seed) and 0 <= self.seed <= 2**63 - self.n),
            "seed",
            f"an integer in [0, 2**63 - n] or None (n = {self.n})",
        )
        check(
            is_num(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
            "presence_penalty",
            "in [-2, 2]",
        )
        check(
            is_num(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
            "frequency_penalty",
            "in [-2, 2]",
        )
        check(
            is_num(self.repetition_penalty) and 0 < self.repetition_penalty <= 10,
            "repetition_penalty",
            "in (0, 10]",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(
                value is None or (is_int(value) and 0 <= value <= _MAX_LOGPROBS),
                name,
                f"None or an integer in [0, {_MAX_LOGPROBS}]",
            )
        check(
            self.logit_bias is None
            or (
                isinstance(self.logit_bias, dict)
                and all(is_int(k) and 0 <= k < 2**31 for k in self.logit_bias)
                and all(is_num(v) and math.isfinite(v) and -100 <= v <= 100 for v in self.logit_bias.values())
            ),
            "logit_bias",
            "a map of token ids to biases in [-100, 100]",
        )
        check(
            self.allowed_token_ids is None
            or (
                isinstance(self.allowed_token_ids, list)
                and len(self.allowed_token_ids) > 0
                and all(is_int(t) and 0 <= t < 2**31 for t in self.allowed_token_ids)
            ),
            "allowed_token_ids",
            "a non-empty list of token ids",
        )
        check(
            self.bad_words is None or all(isinstance(w, str) and w.strip() for w in self.bad_words),
            "bad_words",
            "a list of non-empty strings",
        )
        check(
            self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
            "structured_outputs",
            "a StructuredOutputsParams",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def has_logits_processors(self) -> bool:
        """Anything that changes the logits beyond temperature and the top-k/p and min-p filters."""
        return self.has_penalties or self.has_token_constraints

    @property
    def has_token_constraints(self) -> bool:
        """Logit bias, allowed tokens, bad words or a grammar: speculative decoding proposes no drafts for these."""
        return (
            self.logit_bias is not None
            or self.allowed_token_ids is not None
            or self.bad_words is not None
            or self.structured_outputs is not None
        )

    @property
    def needs_token_history(self) -> bool:
        """Sampling reads the tokens generated so far on the host (penalties, multi-token bad words, grammars),
        so the next step cannot be sampled before this one's token is known."""
        return self.has_penalties or self.bad_words is not None or self.structured_outputs is not None

    @property
    def max_stop_string_len(self) -> int:
        return max((len(s) for s in self.stop), default=0)


def _token_key(key: object) -> object:
    """A logit_bias key as an int when it spells one ("50256" from JSON); anything else is left for the check."""
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return key


_FIELD_ERROR = re.compile(r"^SamplingParams\.(\w+) ")


def error_field(message: str) -> tuple[str | None, str]:
    """The field a ``SamplingParams`` ValueError names and the message after ``SamplingParams.<field> ``, so a
    front end can name it in its own terms (a CLI flag, a request parameter); ``(None, message)`` otherwise."""
    match = _FIELD_ERROR.match(message)
    return (match.group(1), message[match.end() :]) if match else (None, message)
