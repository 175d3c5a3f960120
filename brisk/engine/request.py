"""A request as the scheduler sees it: tokens, progress, and status."""

from __future__ import annotations

import enum
import time

import torch

from brisk.outputs import PositionLogprobs
from brisk.sampling_params import SamplingParams
from brisk.structured_outputs.state import GrammarState


class RequestStatus(enum.IntEnum):
    """Ordered: every status after PREEMPTED is a finished one (a cheap integer test per token)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_REPETITION = enum.auto()  # SamplingParams.repetition_detection found a repeated pattern

    @property
    def finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_REPETITION: "repetition",
        }.get(self)


_PREEMPTED = RequestStatus.PREEMPTED  # the last status of a live request
_NOISE_SEED_OFFSET = 0x9E3779B97F4A7C15  # a seeded request's noise stream starts here past its host stream's seed


class Request:
    """One sequence being generated. ``n > 1`` completions are separate Requests sharing a prompt."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: frozenset[int],
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ):
        self.request_id = request_id
        # Mixed into the hash of the first KV block, so only requests with the same salt share cached blocks.
        self.cache_salt = cache_salt
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0  # tokens whose KV is computed or scheduled to be
        # Tokens sampled on the device by a step still in flight (async scheduling): they are not in
        # ``all_token_ids`` yet, but the next step already computes their KV from the device-side copy.
        self.num_pending_tokens = 0
        # Draft tokens proposed for the next step (speculative decoding); the scheduler takes them when it
        # schedules the request, and the verified step rolls back those the target rejects.
        self.spec_token_ids: list[int] = []
        self.num_draft_tokens = 0  # drafts verified so far
        self.num_accepted_tokens = 0  # of which accepted
        self.num_spec_steps = 0  # steps that verified at least one draft
        self.num_cached_tokens = -1  # prefix-cache hit of the first admission; -1 until admitted
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.logprobs: list[PositionLogprobs] | None = [] if sampling_params.num_logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.prompt_logprobs: list[PositionLogprobs | None] | None = (
            [None] if sampling_params.prompt_logprobs is not None else None
        )
        # A seeded request's random streams: host draws (speculative decoding's acceptance tests) come from
        # ``generator``, sampling noise from ``noise_generator(device)``'s stream on the device that samples.
        self.generator: torch.Generator | None = None
        self._noise_generator: torch.Generator | None = None
        if sampling_params.seed is not None:
            self.generator = torch.Generator().manual_seed(sampling_params.seed)
        # Set by the engine: the request's grammar (structured outputs) and its bad words as token sequences.
        self.grammar: GrammarState | None = None
        self.bad_words_token_ids: list[list[int]] = []
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None

    def noise_generator(self, device: torch.device) -> torch.Generator:
        """The seeded request's sampling-noise stream on ``device``, made on first use. Noise drawn on the host
        costs a vocabulary's worth of serial draws a token (4.5 ms for 152k entries, three times a 1.5B model's
        decode step on an H100) and a copy; on the device it is one kernel. Its seed is offset from the host
        stream's, so acceptance draws and noise never share random numbers."""
        if self._noise_generator is None:
            seed = (self.sampling_params.seed + _NOISE_SEED_OFFSET) % 2**64
            self._noise_generator = torch.Generator(device).manual_seed(seed)
        return self._noise_generator

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_pending(self) -> int:
        return len(self.all_token_ids) + self.num_pending_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Asked for prompt logprobs and does not have one per prompt position yet."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status > _PREEMPTED

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.grammar is not None:
            self.grammar.accept(token_id)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Drop generated tokens past the first ``num_output_tokens`` (a stop string ended the text earlier
        in a step that emitted several tokens), with their logprobs."""
        drop = self.num_output_tokens - num_output_tokens
        if drop <= 0:
            return
        if self.logprobs is not None:
            dropped = zip(self.logprobs[num_output_tokens:], self.output_token_ids[num_output_tokens:])
            self.cumulative_logprob -= sum(position[token].logprob for position, token in dropped)
            del self.logprobs[num_output_tokens:]
        del self.output_token_ids[num_output_tokens:], self.all_token_ids[len(self.all_token_ids) - drop :]

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
