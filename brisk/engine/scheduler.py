"""The token-budget scheduler: one rule for prefill, chunked prefill, decode and preemption.

Every step each scheduled request gets a number of new tokens to compute, under ``max_num_batched_tokens`` and
``max_num_seqs``. Running requests go first (in admission order), then waiting ones; a prompt that does not fit
the remaining budget is computed in chunks. When the KV cache runs out, the most recently admitted running
request is preempted: its blocks are freed and it is recomputed later, keeping the tokens it generated.

Progress is booked when a step is scheduled, not when it returns: ``num_computed_tokens`` advances at once and a
row that samples leaves one *pending* token on its request. So the engine may schedule step N+1 while step N is
still on the device (async scheduling): a decode row of N+1 takes its input token from N's sampled tokens on
the device, and N's results are applied when they arrive.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from brisk.engine.kv_cache_manager import KVCacheManager
from brisk.engine.request import Request, RequestStatus


class ScheduledRequest(NamedTuple):
    request: Request
    num_new_tokens: int
    start: int  # position of the first new token (num_computed_tokens before this step)
    sample: bool  # the chunk reaches the end of the sequence, so the row samples a token


@dataclass
class SchedulerOutput:
    """What the model runner computes this step, in batch order."""

    scheduled: list[ScheduledRequest]
    block_tables: dict[str, list[int]]
    total_num_tokens: int
    preempted: list[Request] = field(default_factory=list)
    # Speculative decoding: the draft tokens each request verifies this step (its last ``len(drafts)`` new tokens).
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    # Speculative decoding, cumulative: verifying steps of a request, drafts verified, drafts accepted.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0


class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
    ):
        self.kv = kv_cache_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.spec_decode_totals = [0, 0, 0]  # SchedulerStats' spec_decode_* counters
        self._num_history_requests = 0  # requests whose sampling reads their own token history
        # Pipeline parallelism: a request whose sampled token is still in flight waits for it (the first stage
        # needs it on the host), so the next batches in flight hold other requests.
        self.defer_pending = False

    # ---- queue management -------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self._num_history_requests += request.sampling_params.needs_token_history

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def needs_sync(self) -> bool:
        """True while a request's sampling needs every earlier token on the host (penalties, bad words, grammars),
        so the next step may not be scheduled before the current one returns."""
        return self._num_history_requests > 0

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests (abort, or a stop string found by the detokenizer) and free their blocks."""
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            self._finish(request, status)
            finished.append(request)
        return finished

    def _finish(self, request: Request, status: RequestStatus) -> None:
        (self.running if request.status == RequestStatus.RUNNING else self.waiting).remove(request)
        request.status = status
        self.kv.free(request)
        del self.requests[request.request_id]
        self._num_history_requests -= request.sampling_params.needs_token_history

    # ---- one step ---------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        spec_token_ids: dict[str, list[int]] = {}
        now = time.time()

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if self._finishes_with_pending(request) or (self.defer_pending and request.num_pending_tokens):
                i += 1
                continue
            num_new = min(request.num_tokens_with_pending - request.num_computed_tokens, budget)
            # Drafts ride along as extra new tokens, as far as the budget allows.
            drafts = self._take_drafts(request, budget - num_new)
            while not self.kv.allocate_slots(request, num_new + len(drafts)):
                if drafts:  # no room for the drafts: decode plainly rather than preempt anyone for them
                    drafts = []
                    continue
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            else:
                scheduled.append(self._book(request, num_new + len(drafts), len(drafts)))
                budget -= num_new + len(drafts)
                if drafts:
                    spec_token_ids[request.request_id] = drafts
                i += 1
                continue
            break  # the request preempted itself: nothing after it can run either

        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                request = self.waiting[0]
                if request.num_pending_tokens:  # preempted while its last step is in flight: wait for it
                    break
                hits, num_hit_tokens = [], 0
                # A request still owed prompt logprobs computes its whole prompt: cached blocks carry no logits.
                lookup = (
                    request.num_computed_tokens == 0
                    and not request.needs_prompt_logprobs
                    and not request.sampling_params.skip_reading_prefix_cache
                )
                if lookup:
                    hits, num_hit_tokens = self.kv.get_computed_blocks(request)
                num_new = min(request.num_tokens - request.num_computed_tokens - num_hit_tokens, budget)
                if not self.kv.allocate_slots(request, num_new, hits):
                    break
                self.waiting.popleft()
                if lookup:
                    self.kv.record_prefix_lookup(request.num_tokens, num_hit_tokens)
                request.num_computed_tokens += num_hit_tokens
                if request.num_cached_tokens < 0:
                    request.num_cached_tokens = num_hit_tokens
                if request.first_scheduled_time is None:
                    request.first_scheduled_time = now
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                scheduled.append(self._book(request, num_new))
                budget -= num_new

        block_tables = {
            entry.request.request_id: self.kv.get_block_ids(entry.request.request_id) for entry in scheduled
        }
        total = self.max_num_batched_tokens - budget
        return SchedulerOutput(scheduled, block_tables, total, preempted, spec_token_ids)

    @staticmethod
    def _book(request: Request, num_new: int, num_drafts: int = 0) -> ScheduledRequest:
        """Count the step's tokens (drafts included) as computed now, and a pending sample if the chunk reaches
        the end."""
        start = request.num_computed_tokens
        request.num_computed_tokens = start + num_new
        sample = request.num_computed_tokens == request.num_tokens_with_pending + num_drafts
        if sample:
            request.num_pending_tokens += 1
        return ScheduledRequest(request, num_new, start, sample)

    def _take_drafts(self, request: Request, room: int) -> list[int]:
        """The request's drafts that fit this step: it must be decoding with nothing in flight, and every draft
        must be able to become an output token (within the budget, max_tokens and max_model_len)."""
        drafts, request.spec_token_ids = request.spec_token_ids, []
        if not drafts or request.num_pending_tokens or request.num_tokens - request.num_computed_tokens != 1:
            return []
        return drafts[: max(0, min(room, self.max_num_drafts(request)))]

    def max_num_drafts(self, request: Request) -> int:
        """How many drafts the request could verify next step, ignoring the budget (for proposers)."""
        max_tokens = request.sampling_params.max_tokens
        room = self.max_model_len - request.num_tokens - 1
        return room if max_tokens is None else min(room, max_tokens - request.num_output_tokens - 1)

    def _finishes_with_pending(self, request: Request) -> bool:
        """Whether the tokens still in flight are sure to end the request by length (so do not schedule it)."""
        if not request.num_pending_tokens:
            return False
        max_tokens = request.sampling_params.max_tokens
        return (
            max_tokens is not None and request.num_output_tokens + request.num_pending_tokens >= max_tokens
        ) or request.num_tokens_with_pending >= self.max_model_len

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.spec_token_ids = []
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def update_from_output(
        self, output: SchedulerOutput, sampled: list[int | None], accepted_drafts: list[list[int]] | None = None
    ) -> list[Request]:
        """Append sampled tokens and apply token-level stops. Returns the requests that finished.

        Requests that ended while the step was in flight (aborted, or stopped by an earlier token) drop the
        token; a request preempted meanwhile keeps it (it was computed from its real KV before the blocks
        were freed). A row that verified drafts appends its accepted drafts before its sampled token, stops at
        the first token that ends it (the rest are dropped) and rolls back the slots of rejected drafts."""
        finished = []
        for row, (entry, token) in enumerate(zip(output.scheduled, sampled)):
            request = entry.request
            if token is None or request.is_finished:
                continue
            request.num_pending_tokens -= 1
            drafts = output.spec_token_ids.get(request.request_id)
            tokens = [*accepted_drafts[row], token] if accepted_drafts else (token,)
            status = None
            for token in tokens:
                request.append_output_token(token)
                status = self._check_stop(request, token)
                if status is not None:
                    break
            if drafts:
                request.num_draft_tokens += len(drafts)
                request.num_accepted_tokens += len(tokens) - 1
                request.num_spec_steps += 1
                for i, count in enumerate((1, len(drafts), len(tokens) - 1)):
                    self.spec_decode_totals[i] += count
                # Verified KV ends before the last emitted token (it is the next step's input).
                request.num_computed_tokens = request.num_tokens - 1
                self.kv.roll_back_slots(request)
            if status is not None:
                self._finish(request, status)
                finished.append(request)
        return finished

    def _check_stop(self, request: Request, token: int) -> RequestStatus | None:
        params = request.sampling_params
        num_output = len(request.output_token_ids)
        if num_output >= params.min_tokens:
            if not params.ignore_eos and token in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if params.stop_token_ids and token in params.stop_token_ids:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if (params.max_tokens is not None and num_output >= params.max_tokens) or len(
            request.all_token_ids
        ) >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        detection = params.repetition_detection
        if detection is not None and num_output >= params.min_tokens and detection.repeats(request.output_token_ids):
            request.stop_reason = "repetition_detected"
            return RequestStatus.FINISHED_REPETITION
        return None

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv.usage(),
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            spec_decode_num_drafts=self.spec_decode_totals[0],
            spec_decode_num_draft_tokens=self.spec_decode_totals[1],
            spec_decode_num_accepted_tokens=self.spec_decode_totals[2],
        )
