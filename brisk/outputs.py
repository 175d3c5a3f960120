"""What `LLM.generate` and the engine hand back to callers."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass
class Logprob:
    """Log-probability of one token under the model's raw distribution, with its rank (1 = most likely)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


# One position: token id -> Logprob, holding the chosen token plus the top-k alternatives.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One of the ``n`` completions of a request. ``text``, ``token_ids`` and ``logprobs`` are cumulative (only
    what is new in a stream of ``RequestOutputKind.DELTA``; ``cumulative_logprob`` is always the whole sum)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop", "length" or "abort"; None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it (None for EOS)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (``time.time()``) of a request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    # Speculative decoding, over all completions: draft tokens verified, of which accepted, in how many steps.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_spec_steps: int = 0

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens emitted per verifying step (accepted drafts plus the target's own token); None without drafts."""
        return 1 + self.num_accepted_tokens / self.num_spec_steps if self.num_spec_steps else None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0


class DeltaOutputs:
    """Turns one request's cumulative outputs into ``RequestOutputKind.DELTA`` ones: each holds only the text,
    token ids and logprobs the previous ones did not, and only the completions that changed (those of ``n > 1``
    that got no token are left out). Prompt logprobs come once, in the first; later outputs have ``[]``.
    Giving it only the newest of several cumulative outputs merges their deltas."""

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, int, bool]] = {}  # completion index -> (chars, tokens, finished) sent
        self._sent_prompt_logprobs = False

    def delta(self, output: RequestOutput) -> RequestOutput:
        completions = []
        for c in output.outputs:
            chars, tokens, finished = self._sent.get(c.index, (0, 0, False))
            if len(c.text) == chars and len(c.token_ids) == tokens and c.finished == finished:
                continue
            self._sent[c.index] = (len(c.text), len(c.token_ids), c.finished)
            # (a stream's cumulative outputs may share one logprobs list that has grown since: cut at the tokens)
            logprobs = None if c.logprobs is None else c.logprobs[tokens : len(c.token_ids)]
            completions.append(replace(c, text=c.text[chars:], token_ids=c.token_ids[tokens:], logprobs=logprobs))
        prompt_logprobs = output.prompt_logprobs
        if prompt_logprobs is not None:
            prompt_logprobs = [] if self._sent_prompt_logprobs else prompt_logprobs
            self._sent_prompt_logprobs = True
        return replace(output, outputs=completions, prompt_logprobs=prompt_logprobs)
