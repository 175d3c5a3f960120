"""Each step's scheduled batch as a small message for the worker processes, and the workers' mirror of the
requests it describes.

The scheduler and the KV-cache manager run once, on the driver. Workers keep a mirror ``Request`` per live
request (the model runner and the sampler read its tokens, sampling parameters and seeded generator), so a step
message carries only what changed: new requests in full, and per scheduled row its token counts, the output
tokens and block ids added since the last message, and the ids of requests that ended."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from brisk.engine.request import Request
from brisk.engine.scheduler import ScheduledRequest, SchedulerOutput
from brisk.sampling_params import SamplingParams
from brisk.structured_outputs.state import GrammarMask


@dataclass
class NewRequestData:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    bad_words_token_ids: list[list[int]]


@dataclass
class StepMessage:
    """One step, as columns (a list per field, in batch order) so that it pickles and unpickles quickly; the
    per-request extras are keyed by request id and hold only requests that have some."""

    finished_ids: list[str]
    new_requests: list[NewRequestData]
    request_ids: list[str] | None  # None: the rows of the last message, in its order (a steady decode batch)
    num_new_tokens: list[int]
    starts: list[int]
    samples: list[bool]
    num_pending_tokens: list[int]
    num_new_output_tokens: list[int]  # per row: output tokens the workers have not seen yet ...
    new_output_tokens: list[int]  # ... and those tokens, row after row
    new_block_ids: dict[str, list[int]]
    reset_blocks: list[str]  # preempted since: their new_block_ids are their whole table
    num_prompt_logprobs: dict[str, int]  # entries in prompt_logprobs, for requests that ask for them
    grammar_bitmasks: dict[str, torch.Tensor]  # rows that sample under a grammar: the tokens it allows next
    spec_token_ids: dict[str, list[int]]  # speculative decoding: the drafts each row verifies this step


@dataclass
class _Sent:
    """What the workers know of one request."""

    request: Request
    num_output_tokens: int = 0
    num_blocks: int = 0  # -1: preempted since, the next row resends the whole table
    table: list[int] | None = None  # the block table sent from; another list (a rollback's) is resent whole


class StepEncoder:
    """Driver side: turns each ``SchedulerOutput`` into a ``StepMessage`` of the changes since the last one."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size  # the width of a grammar's bitmask
        self._sent: dict[str, _Sent] = {}
        self._last_ids: list[str] = []

    def encode(self, schedule: SchedulerOutput) -> StepMessage:
        sent_by_id = self._sent
        finished = [rid for rid, sent in sent_by_id.items() if sent.request.is_finished]
        for rid in finished:
            del sent_by_id[rid]
        for request in schedule.preempted:
            sent = sent_by_id.get(request.request_id)
            if sent is not None and sent.request is request:
                sent.num_blocks = -1
        rows = schedule.scheduled
        requests = [row.request for row in rows]
        ids = [request.request_id for request in requests]
        message = StepMessage(
            finished_ids=finished,
            new_requests=[],
            request_ids=ids,
            num_new_tokens=[row.num_new_tokens for row in rows],
            starts=[row.start for row in rows],
            samples=[row.sample for row in rows],
            num_pending_tokens=[request.num_pending_tokens for request in requests],
            num_new_output_tokens=[],
            new_output_tokens=[],
            new_block_ids={},
            reset_blocks=[],
            num_prompt_logprobs={},
            grammar_bitmasks={},
            spec_token_ids=schedule.spec_token_ids,
        )
        counts, tokens, tables = message.num_new_output_tokens, message.new_output_tokens, schedule.block_tables
        for rid, request, sample in zip(ids, requests, message.samples):
            # A grammar's matcher lives here: its requests keep the engine synchronous (``needs_token_history``),
            # so it has taken every earlier token and says what may come next.
            if sample and request.grammar is not None and not request.grammar.done:
                message.grammar_bitmasks[rid] = request.grammar.next_token_bitmask(self.vocab_size)
            sent = sent_by_id.get(rid)
            if sent is None or sent.request is not request:
                sent = sent_by_id[rid] = _Sent(request)
                message.new_requests.append(
                    NewRequestData(
                        rid,
                        request.prompt_token_ids,
                        request.sampling_params,
                        request.eos_token_ids,
                        request.bad_words_token_ids,
                    )
                )
            outputs = request.output_token_ids
            counts.append(len(outputs) - sent.num_output_tokens)
            if counts[-1]:
                tokens += outputs[sent.num_output_tokens :]
                sent.num_output_tokens = len(outputs)
            table = tables[rid]
            if sent.num_blocks < 0 or (table is not sent.table and sent.table is not None):
                message.reset_blocks.append(rid)
                sent.num_blocks = 0
            sent.table = table
            if len(table) > sent.num_blocks:
                message.new_block_ids[rid] = table[sent.num_blocks :]
                sent.num_blocks = len(table)
            if request.prompt_logprobs is not None:
                message.num_prompt_logprobs[rid] = len(request.prompt_logprobs)
        if ids == self._last_ids and not message.new_requests:  # the same requests (a new one may reuse an id)
            message.request_ids = None
        self._last_ids = ids
        return message


class RequestMirror:
    """Worker side: the live requests as the driver last described them, and the ``SchedulerOutput`` of a step."""

    def __init__(self, samples: bool = True) -> None:
        """``samples=False`` (a pipeline stage before the last): rows never sample and no prompt logprobs are
        computed, since this stage has no LM head."""
        self.samples = samples
        self._requests: dict[str, Request] = {}
        self._block_tables: dict[str, list[int]] = {}
        self._rows: list[Request] = []  # the last message's rows, and their block tables
        self._row_tables: dict[str, list[int]] = {}
        self._masked: list[Request] = []  # requests given a grammar's bitmask by the last message

    def __len__(self) -> int:
        return len(self._requests)

    def apply(self, message: StepMessage) -> SchedulerOutput:
        requests, tables = self._requests, self._block_tables
        for rid in message.finished_ids:
            requests.pop(rid, None)
            tables.pop(rid, None)
        for new in message.new_requests:
            params = new.sampling_params if self.samples else replace(new.sampling_params, prompt_logprobs=None)
            request = Request(new.request_id, new.prompt_token_ids, params, new.eos_token_ids, arrival_time=0.0)
            request.bad_words_token_ids = new.bad_words_token_ids
            requests[new.request_id] = request
            tables[new.request_id] = []
        if message.request_ids is not None:  # other rows than last time
            self._rows = [requests[rid] for rid in message.request_ids]
            self._row_tables = {rid: tables[rid] for rid in message.request_ids}  # the lists below, shared
        rows = self._rows
        tokens, offset = message.new_output_tokens, 0
        for request, count, pending in zip(rows, message.num_new_output_tokens, message.num_pending_tokens):
            request.num_pending_tokens = pending
            if count:
                for token in tokens[offset : offset + count]:
                    request.append_output_token(token)
                offset += count
        for rid in message.reset_blocks:  # a new list, as on the driver: the model runner follows tables by identity
            tables[rid] = []
            if rid in self._row_tables:
                self._row_tables[rid] = tables[rid]
        for rid, block_ids in message.new_block_ids.items():
            tables[rid].extend(block_ids)
        if self.samples:
            for rid, count in message.num_prompt_logprobs.items():
                requests[rid].prompt_logprobs = [None] * count
            for request in self._masked:
                request.grammar = None
            self._masked = [requests[rid] for rid in message.grammar_bitmasks]
            for request in self._masked:
                request.grammar = GrammarMask(message.grammar_bitmasks[request.request_id])
        samples = message.samples if self.samples else [False] * len(message.samples)
        scheduled = list(map(ScheduledRequest, rows, message.num_new_tokens, message.starts, samples))
        return SchedulerOutput(
            scheduled, self._row_tables, sum(message.num_new_tokens), spec_token_ids=message.spec_token_ids
        )
