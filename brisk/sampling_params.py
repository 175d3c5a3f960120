"""How to sample a request's completions. Every field is validated: bad values raise ``ValueError`` naming it.

Every constructor field of vLLM 0.26's ``SamplingParams`` is accepted, so code written for vLLM runs as is; a
value that asks for something brisk does not do (``flat_logprobs=True``, a ``thinking_token_budget``, non-empty
``extra_args``) is a ``ValueError`` that names the field and the values it takes."""

from __future__ import annotations

import copy
import enum
import math
import re
from dataclasses import dataclass
from typing import Any

from brisk.structured_outputs import StructuredOutputsParams

_MAX_LOGPROBS = 20
_MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's limit too
_MAX_N = 128

__all__ = ["RepetitionDetectionParams", "RequestOutputKind", "SamplingParams", "StructuredOutputsParams"]


class RequestOutputKind(enum.Enum):
    """What each streamed ``RequestOutput`` holds (vLLM's names). ``LLM.generate`` returns the finished outputs
    whatever the kind; ``LLMEngine.step()`` and ``AsyncLLM`` streams follow it."""

    CUMULATIVE = 0  # everything generated so far, every time
    DELTA = 1  # only what is new since the previous output of the request
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass
class RepetitionDetectionParams:
    """End a completion (``finish_reason="repetition"``) once its last ``pattern * min_count`` tokens are one
    pattern of ``min_pattern_size`` to ``max_pattern_size`` tokens repeated ``min_count`` times (vLLM's
    parameters: ``max_pattern_size=0`` turns it off; ``min_pattern_size=0`` means 1)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        sizes = (self.max_pattern_size, self.min_pattern_size, self.min_count)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in sizes):
            raise ValueError(f"RepetitionDetectionParams fields must be integers, got {self!r}.")
        if self.max_pattern_size < 0 or not 0 <= self.min_pattern_size <= self.max_pattern_size:
            raise ValueError(
                "RepetitionDetectionParams needs 0 <= min_pattern_size <= max_pattern_size (both 0 turns detection "
                f"off), got {self!r}."
            )
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError(
                "RepetitionDetectionParams.min_count must be at least 2 when max_pattern_size > 0 (or set "
                f"max_pattern_size=0 to turn detection off), got {self!r}."
            )

    @property
    def enabled(self) -> bool:
        return self.max_pattern_size > 0

    def repeats(self, token_ids: list[int]) -> bool:
        """Whether ``token_ids`` ends with some pattern of an allowed size repeated ``min_count`` times."""
        if not self.enabled:
            return False
        count = self.min_count
        for size in range(max(self.min_pattern_size, 1), self.max_pattern_size + 1):
            span = size * count
            if span > len(token_ids):
                return False
            if token_ids[-span:] == token_ids[-size:] * count:
                return True
        return False


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
    # The rest of vLLM 0.26's fields. Logprobs of these token ids at each generated position (with the chosen
    # token's), instead of the top ``logprobs``; ``logprobs``, when set too, must equal their number.
    logprob_token_ids: list[int] | None = None
    flat_logprobs: bool = False  # True (vLLM's FlatLogprobs container) is refused: logprobs are a list of dicts
    spaces_between_special_tokens: bool = True  # either value: fast tokenizers add no such spaces (as the server)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    skip_clone: bool = False  # clone() makes a shallow copy
    # Characters of streamed text held back for stop strings (set from ``stop`` as vLLM does; brisk's
    # detokenizer holds back what it needs itself, so this is informational).
    output_text_buffer_length: int = 0
    extra_args: dict[str, Any] | None = None  # for custom samplers and plugins, which brisk has none of
    routed_experts_prompt_start: int = 0  # brisk returns no MoE routing data: any start asks for nothing
    # True: this request reads nothing from the prefix cache. None (as False): it does, unless it asks for
    # prompt logprobs (cached blocks carry no logits, so those requests always compute their whole prompt).
    skip_reading_prefix_cache: bool | None = None
    thinking_token_budget: int | None = None  # None or -1 (unlimited) only
    repetition_detection: RepetitionDetectionParams | None = None

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
        if isinstance(self.logprob_token_ids, (list, tuple)):  # an empty list asks for nothing, as in vLLM
            self.logprob_token_ids = list(self.logprob_token_ids) or None
        if not isinstance(self.output_kind, RequestOutputKind):  # a name, or another library's enum member
            name = getattr(self.output_kind, "name", self.output_kind)
            if isinstance(name, str) and name.upper() in RequestOutputKind.__members__:
                self.output_kind = RequestOutputKind[name.upper()]
        if type(self.thinking_token_budget) is int and self.thinking_token_budget == -1:
            self.thinking_token_budget = None  # vLLM's "unlimited"
        if isinstance(self.repetition_detection, dict):
            self.repetition_detection = RepetitionDetectionParams(**self.repetition_detection)
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = self.max_stop_string_len - 1
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
        self._validate_vllm_fields(check, is_int)

    def _validate_vllm_fields(self, check, is_int) -> None:
        ids = self.logprob_token_ids
        check(
            ids is None
            or (
                isinstance(ids, list)
                and len(ids) <= _MAX_LOGPROB_TOKEN_IDS
                and all(is_int(t) and 0 <= t < 2**31 for t in ids)
            ),
            "logprob_token_ids",
            f"None or a list of at most {_MAX_LOGPROB_TOKEN_IDS} token ids",
        )
        if ids is not None and self.logprobs is not None and self.logprobs != len(ids):
            raise ValueError(
                f"SamplingParams.logprob_token_ids lists {len(ids)} tokens but logprobs is {self.logprobs}: leave "
                f"logprobs unset (or set it to {len(ids)})."
            )
        for name in ("flat_logprobs", "spaces_between_special_tokens", "skip_clone"):
            check(isinstance(getattr(self, name), bool), name, "True or False")
        check(
            self.flat_logprobs is False,
            "flat_logprobs",
            "False (brisk returns logprobs as a list of {token id: Logprob} dicts, one per position)",
        )
        check(
            isinstance(self.output_kind, RequestOutputKind),
            "output_kind",
            "a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY)",
        )
        check(
            is_int(self.output_text_buffer_length) and self.output_text_buffer_length >= 0,
            "output_text_buffer_length",
            "a non-negative integer",
        )
        check(
            self.extra_args is None or self.extra_args == {},
            "extra_args",
            "None or empty (brisk has no custom sampling code or plugins to read them; its server refuses "
            "vllm_xargs alike)",
        )
        check(
            is_int(self.routed_experts_prompt_start) and self.routed_experts_prompt_start >= 0,
            "routed_experts_prompt_start",
            "a non-negative integer",
        )
        check(
            self.skip_reading_prefix_cache is None or isinstance(self.skip_reading_prefix_cache, bool),
            "skip_reading_prefix_cache",
            "None, True or False",
        )
        check(
            self.thinking_token_budget is None,
            "thinking_token_budget",
            "None or -1 (unlimited): brisk does not cap reasoning tokens (use max_tokens to bound the whole reply)",
        )
        check(
            self.repetition_detection is None or isinstance(self.repetition_detection, RepetitionDetectionParams),
            "repetition_detection",
            "None or a RepetitionDetectionParams",
        )

    def clone(self) -> SamplingParams:
        """A copy that can be changed without touching this one (shallow when ``skip_clone``, as in vLLM)."""
        return copy.copy(self) if self.skip_clone else copy.deepcopy(self)

    @property
    def num_logprobs(self) -> int | None:
        """Logprob entries asked for at each generated position besides the chosen token's: ``logprobs``, or
        the number of ``logprob_token_ids``; None when no sample logprobs are asked for."""
        if self.logprob_token_ids is not None:
            return len(self.logprob_token_ids)
        return self.logprobs

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
