"""One request's stream of outputs on the asyncio side of :class:`~brisk.engine.async_engine.AsyncLLM`.

The engine process sends each step's output *deltas*; the reader thread turns them into cumulative
:class:`RequestOutput`\\ s here (:meth:`RequestStream._assemble`), and the event loop hands them to the consumer,
skipping to the newest when it falls behind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from brisk.outputs import CompletionOutput, DeltaOutputs, RequestMetrics, RequestOutput

if TYPE_CHECKING:
    from brisk.engine.async_engine import AsyncLLM

ACCEPTED = object()  # delivered when the engine took the request (not an output)


class RequestTimeoutError(TimeoutError):
    """The request did not finish by its deadline (it has been aborted)."""


class RequestStream:
    """The outputs of one request, as an async iterator of cumulative :class:`RequestOutput`s.

    Outputs are cumulative, so when the consumer falls behind only the newest one matters: the iterator skips
    to the latest output available. With ``delta`` (``RequestOutputKind.DELTA``) each output holds only what
    is new since the previous one the consumer got (so skipping merges deltas). ``FINAL_ONLY`` needs nothing
    here: the engine sends only the final output. Leaving the iteration early (break, cancellation, error)
    should be followed by :meth:`abort` (``async with`` does it).
    """

    def __init__(
        self,
        request_id: str,
        owner: AsyncLLM,
        prompt: Any = None,
        arrival_time: float | None = None,
        timeout_s: float | None = None,
        delta: bool = False,
    ):
        self.request_id = request_id
        self._deltas = DeltaOutputs() if delta else None
        self.timeout_s = timeout_s
        # time.monotonic() by which the request must have ended, or None
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._owner = owner
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.finished = False
        self._waiting_counted = False
        self._in_flight = False
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        # What the outputs are rebuilt from (reader thread only, after construction).
        if isinstance(prompt, Mapping):  # one of vLLM's prompt dicts
            prompt = prompt.get("prompt_token_ids") or prompt.get("prompt")
        is_ids = isinstance(prompt, (list, tuple))
        self._prompt = None if is_ids else prompt
        self._prompt_token_ids: list[int] = list(prompt) if is_ids else []
        self._texts: list[str] = []
        self._token_ids: list[list[int]] = []
        self._logprobs: list[list[Any] | None] = []
        self._prompt_logprobs: list[Any] | None = None
        self._metrics = RequestMetrics(self.arrival_time)

    # reader thread: one ("out", ...) event of the engine process -> the cumulative output
    def _assemble(self, event: tuple[Any, ...]) -> RequestOutput:
        _, request_id, finished, completions, timings, num_cached, prompt_token_ids, prompt_logprobs = event
        if prompt_token_ids is not None:
            self._prompt_token_ids = prompt_token_ids
        texts, token_ids, logprobs = self._texts, self._token_ids, self._logprobs
        if not texts:
            n = len(completions)
            texts.extend([""] * n)
            token_ids.extend([] for _ in range(n))
            logprobs.extend([None] * n)
        outs = []
        for i, (piece, replace, new_ids, new_logprobs, cumulative, finish_reason, stop_reason) in enumerate(
            completions
        ):
            text = texts[i] = piece if replace else texts[i] + piece
            ids = token_ids[i] = token_ids[i] + new_ids  # a new list: earlier outputs keep theirs
            if new_logprobs is not None:
                if logprobs[i] is None:
                    logprobs[i] = []
                logprobs[i].extend(new_logprobs)
            outs.append(CompletionOutput(i, text, ids, cumulative, logprobs[i], finish_reason, stop_reason))
        if prompt_logprobs is not None:
            if self._prompt_logprobs is None:
                self._prompt_logprobs = []
            self._prompt_logprobs.extend(prompt_logprobs)
        m = self._metrics
        m.arrival_time, m.first_scheduled_time, m.first_token_time, m.last_token_time, m.finished_time = timings
        return RequestOutput(
            request_id=request_id,
            prompt=self._prompt,
            prompt_token_ids=self._prompt_token_ids,
            outputs=outs,
            finished=finished,
            metrics=m,
            prompt_logprobs=self._prompt_logprobs,
            num_cached_tokens=num_cached,
        )

    # loop thread
    def _put(self, item: Any) -> None:
        if item is not ACCEPTED:
            if self._waiting_counted:  # first output (or the end): no longer waiting
                self._waiting_counted = False
                self._owner._num_waiting -= 1
            if self._in_flight and (isinstance(item, BaseException) or item.finished):
                self._in_flight = False
                self._owner._num_in_flight -= 1
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def _get(self) -> Any:
        if self.deadline is None:
            return await self._queue.get()
        remaining = self.deadline - time.monotonic()
        try:
            if remaining <= 0:
                return self._queue.get_nowait()
            return await asyncio.wait_for(self._queue.get(), remaining)
        except (TimeoutError, asyncio.QueueEmpty):
            self.abort()
            raise RequestTimeoutError(
                f"The request did not finish within the server's request timeout "
                f"({self.timeout_s:g} s); it was aborted."
            ) from None

    async def first_item(self) -> Any:
        """What the engine said first: ``ACCEPTED``, or the exception rejecting the request."""
        try:
            return await self._get()
        except RequestTimeoutError as exc:
            return exc

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._get()
        while isinstance(item, RequestOutput) and not item.finished and not self._queue.empty():
            item = self._queue.get_nowait()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item if self._deltas is None else self._deltas.delta(item)

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._owner.abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.abort()
