"""Each step's scheduled batch as a small message for the worker processes, and the workers' mirror of the
requests it describes.

The scheduler and the KV-cache manager run once, on the driver. Workers keep a mirror ``Request`` per live
request (the model runner and the sampler read its tokens, sampling parameters and seeded generator), so a step
message carries only what changed: new requests in full, and per scheduled row its token counts, the output
tokens and block ids added since the last message, and the ids of requests that ended."""

from __future__ import annotations

from dataclasses import dataclass, replace

from brisk.engine.request import Request
from brisk.engine.scheduler import ScheduledRequest, SchedulerOutput
from brisk.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]


@dataclass
class ScheduledRow:
    request_id: str
    num_new_tokens: int
    start: int
    sample: bool
    new_output_tokens: list[int]  # output tokens the workers have not seen yet
    num_pending_tokens: int
    new_block_ids: list[int]
    reset_blocks: bool  # the request was preempted: new_block_ids is its whole table
    num_prompt_logprobs: int  # entries in the request's prompt_logprobs (0 when it asks for none)


@dataclass
class StepMessage:
    finished_ids: list[str]
    new_requests: list[NewRequestData]
    rows: list[ScheduledRow]


@dataclass
class _Sent:
    """What the workers know of one request."""

    request: Request
    num_output_tokens: int = 0
    num_blocks: int = 0  # -1: preempted since, the next row resends the whole table


class StepEncoder:
    """Driver side: turns each ``SchedulerOutput`` into a ``StepMessage`` of the changes since the last one."""

    def __init__(self) -> None:
        self._sent: dict[str, _Sent] = {}

    def encode(self, schedule: SchedulerOutput) -> StepMessage:
        finished = [rid for rid, sent in self._sent.items() if sent.request.is_finished]
        for rid in finished:
            del self._sent[rid]
        for request in schedule.preempted:
            sent = self._sent.get(request.request_id)
            if sent is not None and sent.request is request:
                sent.num_blocks = -1
        new_requests: list[NewRequestData] = []
        rows: list[ScheduledRow] = []
        for request, num_new, start, sample in schedule.scheduled:
            rid = request.request_id
            sent = self._sent.get(rid)
            if sent is None or sent.request is not request:
                sent = self._sent[rid] = _Sent(request)
                new_requests.append(
                    NewRequestData(rid, request.prompt_token_ids, request.sampling_params, request.eos_token_ids)
                )
            table = schedule.block_tables[rid]
            reset = sent.num_blocks < 0
            new_blocks = table if reset else table[sent.num_blocks :]
            outputs = request.output_token_ids
            rows.append(
                ScheduledRow(
                    rid,
                    num_new,
                    start,
                    sample,
                    outputs[sent.num_output_tokens :],
                    request.num_pending_tokens,
                    new_blocks,
                    reset,
                    len(request.prompt_logprobs or ()),
                )
            )
            sent.num_blocks, sent.num_output_tokens = len(table), len(outputs)
        return StepMessage(finished, new_requests, rows)


class RequestMirror:
    """Worker side: the live requests as the driver last described them, and the ``SchedulerOutput`` of a step."""

    def __init__(self, samples: bool = True) -> None:
        """``samples=False`` (a pipeline stage before the last): rows never sample and no prompt logprobs are
        computed, since this stage has no LM head."""
        self.samples = samples
        self._requests: dict[str, Request] = {}
        self._block_tables: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def apply(self, message: StepMessage) -> SchedulerOutput:
        for rid in message.finished_ids:
            self._requests.pop(rid, None)
            self._block_tables.pop(rid, None)
        for new in message.new_requests:
            params = new.sampling_params if self.samples else replace(new.sampling_params, prompt_logprobs=None)
            self._requests[new.request_id] = Request(
                new.request_id, new.prompt_token_ids, params, new.eos_token_ids, arrival_time=0.0
            )
            self._block_tables[new.request_id] = []
        scheduled: list[ScheduledRequest] = []
        block_tables: dict[str, list[int]] = {}
        for row in message.rows:
            request = self._requests[row.request_id]
            for token in row.new_output_tokens:
                request.append_output_token(token)
            request.num_pending_tokens = row.num_pending_tokens
            if request.prompt_logprobs is not None:
                request.prompt_logprobs = [None] * row.num_prompt_logprobs
            table = self._block_tables[row.request_id]
            if row.reset_blocks:
                table.clear()
            table.extend(row.new_block_ids)
            block_tables[row.request_id] = table
            scheduled.append(ScheduledRequest(request, row.num_new_tokens, row.start, row.sample and self.samples))
        total = sum(row.num_new_tokens for row in message.rows)
        return SchedulerOutput(scheduled, block_tables, total)
