"""Each step's scheduled batch as a small message for the worker processes, and the workers' mirror of the
requests it describes.

The scheduler and the KV-cache manager run once, on the driver. Workers keep a mirror ``Request`` per live
request (the model runner and the sampler read its tokens, sampling parameters and seeded generator), so a step
message carries only what changed: new requests in full, and per scheduled row its token counts, the output
tokens and block ids added since the last message, and the ids of requests that ended."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import compress
from operator import is_, ne, sub

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
    """One step, as columns (a sequence per field, in batch order) so that it pickles and unpickles quickly; the
    per-request extras are keyed by request id and hold only requests that have some. In a steady decode batch
    most columns repeat or are all ones: those travel as None."""

    finished_ids: list[str]
    new_requests: list[NewRequestData]
    request_ids: list[str] | None  # None: the rows of the last message, in its order (a steady decode batch)
    num_new_tokens: Sequence[int]
    starts: Sequence[int]
    samples: Sequence[bool]
    num_pending_tokens: Sequence[int] | None  # None: each row's value of the last message
    num_new_output_tokens: Sequence[int] | None  # per row: output tokens the workers have not seen (None: one) ...
    new_output_tokens: list[int]  # ... and those tokens, row after row
    new_block_ids: dict[str, list[int]]
    reset_blocks: list[str]  # preempted since: their new_block_ids are their whole table
    num_prompt_logprobs: dict[str, int]  # entries in prompt_logprobs, for requests that ask for them
    grammar_bitmasks: dict[str, torch.Tensor]  # rows that sample under a grammar: the tokens it allows next
    spec_token_ids: dict[str, list[int]]  # speculative decoding: the drafts each row verifies this step


@dataclass
class _Sent:
    """What the workers know of one request (while it is a row of the last message, the encoder's row columns
    hold its counts instead, written back when the rows change)."""

    request: Request
    num_output_tokens: int = 0
    num_blocks: int = 0  # -1: preempted since, the next row resends the whole table
    table: list[int] | None = None  # the block table sent from; another list (a rollback's) is resent whole


class StepEncoder:
    """Driver side: turns each ``SchedulerOutput`` into a ``StepMessage`` of the changes since the last one.

    A step whose rows are the last step's requests in the same order (a steady decode batch, the common case at
    high concurrency) is encoded by whole-column operations against the last step's columns, not a loop over
    rows: the message's cost then stays a few microseconds per hundred rows."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size  # the width of a grammar's bitmask
        self._sent: dict[str, _Sent] = {}
        self._last_ids: list[str] = []
        # The last message's rows, as columns: requests, their _Sent, output tokens, block tables and counts sent.
        self._rows: tuple[Request, ...] = ()
        self._row_sent: list[_Sent] = []
        self._row_outputs: list[int] = []
        self._row_tables: list[list[int]] = []
        self._row_blocks: list[int] = []
        self._row_pending: list[int] | None = None

    def encode(self, schedule: SchedulerOutput) -> StepMessage:
        rows = schedule.scheduled
        requests, num_new, starts, samples = zip(*rows) if rows else ((), (), (), ())
        ids = [request.request_id for request in requests]
        steady = ids == self._last_ids and all(map(is_, requests, self._rows))
        if not steady:
            self._write_back()
        sent_by_id = self._sent
        finished = [rid for rid, sent in sent_by_id.items() if sent.request.is_finished]
        for rid in finished:
            del sent_by_id[rid]
        for request in schedule.preempted:
            sent = sent_by_id.get(request.request_id)
            if sent is not None and sent.request is request:
                sent.num_blocks = -1
        message = StepMessage(
            finished_ids=finished,
            new_requests=[],
            request_ids=None if steady else ids,
            num_new_tokens=num_new,
            starts=starts,
            samples=samples,
            num_pending_tokens=[request.num_pending_tokens for request in requests],
            num_new_output_tokens=None,
            new_output_tokens=[],
            new_block_ids={},
            reset_blocks=[],
            num_prompt_logprobs={},
            grammar_bitmasks={},
            spec_token_ids=schedule.spec_token_ids,
        )
        if message.num_pending_tokens == self._row_pending and steady:
            message.num_pending_tokens = None
        else:
            self._row_pending = message.num_pending_tokens
        if not steady:
            self._new_rows(requests, ids, message)
        self._encode_outputs(requests, message)
        self._encode_tables(ids, [schedule.block_tables[rid] for rid in ids], message)
        for request in requests:
            if request.grammar is not None or request.prompt_logprobs is not None:
                self._encode_extras(request, message)
        self._last_ids = ids
        return message

    def _write_back(self) -> None:
        """The last rows' counts into their _Sent records, before the rows change."""
        for sent, outputs, table, blocks in zip(self._row_sent, self._row_outputs, self._row_tables, self._row_blocks):
            sent.num_output_tokens, sent.table = outputs, table
            if sent.num_blocks >= 0:  # not marked preempted since
                sent.num_blocks = blocks

    def _new_rows(self, requests: tuple[Request, ...], ids: list[str], message: StepMessage) -> None:
        """Rows other than last time: find (or start) each request's record and load the row columns from them."""
        sent_by_id = self._sent
        row_sent = []
        for rid, request in zip(ids, requests):
            sent = sent_by_id.get(rid)
            if sent is None or sent.request is not request:  # new, or a new request under a finished one's id
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
            row_sent.append(sent)
        self._rows, self._row_sent = requests, row_sent
        self._row_outputs = [sent.num_output_tokens for sent in row_sent]
        self._row_tables = [sent.table for sent in row_sent]
        self._row_blocks = [sent.num_blocks for sent in row_sent]

    def _encode_outputs(self, requests: tuple[Request, ...], message: StepMessage) -> None:
        outputs = [len(request.output_token_ids) for request in requests]
        counts = list(map(sub, outputs, self._row_outputs))
        if counts.count(1) == len(counts):  # one new token per row: the last ones
            message.new_output_tokens = [request.output_token_ids[-1] for request in requests]
        else:
            message.num_new_output_tokens = counts
            tokens = message.new_output_tokens
            for request, count, seen in zip(requests, counts, self._row_outputs):
                if count:
                    tokens += request.output_token_ids[seen:]
        self._row_outputs = outputs

    def _encode_tables(self, ids: list[str], tables: list[list[int]], message: StepMessage) -> None:
        """New block ids per row; a row whose table is another list than last time (a rollback's, or one
        rebuilt after preemption), or that was preempted since, is resent whole."""
        blocks = self._row_blocks
        changed = not all(map(is_, tables, self._row_tables)) or -1 in blocks
        lengths = list(map(len, tables))
        if changed:
            rows = range(len(ids))
        else:  # the rows that grew: a block every 16 tokens, a few rows a step
            rows = compress(range(len(ids)), map(ne, lengths, blocks)) if lengths != blocks else ()
        sent_tables = self._row_tables
        for i in rows:
            rid, table, sent_blocks = ids[i], tables[i], blocks[i]
            if sent_blocks < 0 or (table is not sent_tables[i] and sent_tables[i] is not None):
                message.reset_blocks.append(rid)
                sent_blocks = 0
            if lengths[i] > sent_blocks:
                message.new_block_ids[rid] = table[sent_blocks:]
        self._row_tables, self._row_blocks = tables, lengths

    def _encode_extras(self, request: Request, message: StepMessage) -> None:
        """A grammar's next-token bitmask and the prompt logprobs' count, for the rare rows that have them."""
        rid = request.request_id
        # A grammar's matcher lives here: its requests keep the engine synchronous (``needs_token_history``), so
        # it has taken every earlier token and says what may come next.
        grammar = request.grammar
        if grammar is not None and not grammar.done and message.samples[self._rows.index(request)]:
            message.grammar_bitmasks[rid] = grammar.next_token_bitmask(self.vocab_size)
        if request.prompt_logprobs is not None:
            message.num_prompt_logprobs[rid] = len(request.prompt_logprobs)


# ScheduledRequest from a (request, num_new_tokens, start, sample) tuple, without the NamedTuple's Python __new__.
_scheduled_request = partial(tuple.__new__, ScheduledRequest)


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
        if message.num_pending_tokens is not None:
            for request, pending in zip(rows, message.num_pending_tokens):
                request.num_pending_tokens = pending
        tokens = message.new_output_tokens
        if message.num_new_output_tokens is None:  # one new token per row
            for request, token in zip(rows, tokens):
                request.append_output_token(token)
        else:
            offset = 0
            for request, count in zip(rows, message.num_new_output_tokens):
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
        scheduled = list(map(_scheduled_request, zip(rows, message.num_new_tokens, message.starts, samples)))
        return SchedulerOutput(
            scheduled, self._row_tables, sum(message.num_new_tokens), spec_token_ids=message.spec_token_ids
        )
