"""AsyncLLM: an asyncio front end over :class:`LLMEngine`, whose loop runs in a dedicated thread.

Threading model
---------------
One thread (``brisk-engine``) owns the ``LLMEngine`` and is the only code that touches it. The asyncio loop
(the HTTP server) talks to it through a thread-safe inbox of commands (add / abort / stop):

* while the engine has work, the thread drains the inbox between steps, calls ``engine.step()`` and hands the
  step's outputs to the requests' ``asyncio.Queue``s with one ``loop.call_soon_threadsafe`` per step;
* when the engine is idle, the thread blocks on the inbox (no polling, no busy loop).

Every request that is running at a step is computed in that step, so concurrent streams are batched together
(continuous batching is the scheduler's job; this class only keeps it fed). Tokenization, chat templates,
detokenized deltas and JSON live on the asyncio side, so they never take the engine thread's time (only the
GIL). A thread rather than a process keeps the server simple and the outputs zero-copy; a separate process is
the next step if the HTTP side ever needs more than a core.

Failure model: ``add_request`` errors (bad prompt, ...) are raised to the caller of
:meth:`AsyncLLM.add_request` only; an exception from ``engine.step()`` fails the requests in flight (each gets
an :class:`EngineError`) and the loop carries on; only an error outside those (a bug in this loop) kills the
thread, after which :attr:`is_alive` is false and new requests are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from brisk.outputs import RequestOutput
from brisk.sampling_params import SamplingParams

logger = logging.getLogger("brisk.engine")

__all__ = ["AsyncLLM", "EngineDeadError", "EngineError", "QueueFullError", "RequestStream"]


class EngineError(RuntimeError):
    """The engine failed while computing a request (not the request's fault)."""


class EngineDeadError(EngineError):
    """The engine loop is not running (stopped, or died); no request can be served."""


class QueueFullError(RuntimeError):
    """Too many requests are waiting for the engine; retry later."""


_ACCEPTED = object()
_STOP = object()


class RequestStream:
    """The outputs of one request, as an async iterator of cumulative :class:`RequestOutput`s.

    Outputs are cumulative, so when the consumer falls behind only the newest one matters: the iterator skips
    to the latest output available. Leaving the iteration early (break, cancellation, error) should be
    followed by :meth:`abort` (``async with`` does it).
    """

    def __init__(self, request_id: str, owner: AsyncLLM):
        self.request_id = request_id
        self._owner = owner
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.finished = False
        self._waiting_counted = False
        self._in_flight = False

    # loop thread
    def _put(self, item: Any) -> None:
        if item is not _ACCEPTED:
            if self._waiting_counted:  # first output (or the end): no longer waiting
                self._waiting_counted = False
                self._owner._num_waiting -= 1
            if self._in_flight and (isinstance(item, BaseException) or item.finished):
                self._in_flight = False
                self._owner._num_in_flight -= 1
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        while isinstance(item, RequestOutput) and not item.finished and not self._queue.empty():
            item = self._queue.get_nowait()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._owner.abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.abort()


class AsyncLLM:
    """Runs an ``LLMEngine`` in its own thread and serves requests to asyncio code.

    ``max_waiting_requests`` bounds the requests accepted but not yet producing tokens (queued in the inbox,
    waiting in the scheduler or in their prefill); beyond it :meth:`add_request` raises
    :class:`QueueFullError`.
    """

    def __init__(
        self,
        engine: Any,
        *,
        max_waiting_requests: int | None = None,
        metrics: Any | None = None,
        stats_interval_s: float = 0.1,
    ):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.max_model_len
        self.vocab_size: int | None = _vocab_size(engine)
        self.max_waiting_requests = max_waiting_requests
        self.metrics = metrics
        self._stats_interval_s = stats_interval_s
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._num_waiting = 0  # loop thread only
        self._num_in_flight = 0  # loop thread only
        self._error: BaseException | None = None
        self._stopped = False
        self._last_stats_time = 0.0
        self.num_steps = 0

    @classmethod
    def from_engine_args(cls, engine_args: Any, **kwargs: Any) -> AsyncLLM:
        from brisk.engine.engine import LLMEngine

        return cls(LLMEngine.from_engine_args(engine_args), **kwargs)

    # ------------------------------------------------------------------------------------------
    # lifecycle (call from the event loop)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="brisk-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return (
            self._thread is not None and self._thread.is_alive() and not self._stopped and self._error is None
        )

    @property
    def num_in_flight(self) -> int:
        return self._num_in_flight

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine thread; requests still in flight end with :class:`EngineDeadError`."""
        self._stopped = True
        if self._thread is None:
            return
        self._inbox.put(_STOP)
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._thread.is_alive():
            logger.warning("Engine thread did not stop within %.1f s", timeout_s)

    # ------------------------------------------------------------------------------------------
    # requests (call from the event loop)

    async def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> RequestStream:
        """Submit a request; returns once the engine has accepted it.

        Raises ``ValueError`` (the engine rejected the request: its message is for the client),
        :class:`QueueFullError` or :class:`EngineDeadError`.
        """
        if not self.is_alive:
            raise EngineDeadError(self._dead_message())
        if self.max_waiting_requests is not None and self._num_waiting >= self.max_waiting_requests:
            raise QueueFullError(
                f"The server is overloaded: {self._num_waiting} requests are already waiting "
                f"(--max-waiting-requests {self.max_waiting_requests}). Retry later."
            )
        stream = RequestStream(request_id, self)
        stream._waiting_counted = stream._in_flight = True
        self._num_waiting += 1
        self._num_in_flight += 1
        self._inbox.put(("add", request_id, prompt, params, arrival_time or time.time(), stream))
        try:
            first = await stream._queue.get()
        except BaseException:
            stream.abort()
            raise
        if first is not _ACCEPTED:
            stream.finished = True
            raise first
        return stream

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Convenience: add a request and yield its outputs; aborts it if the caller stops early."""
        stream = await self.add_request(request_id, prompt, params)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    def abort(self, request_ids: str | Iterable[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        if ids:
            self._inbox.put(("abort", ids))

    def _dead_message(self) -> str:
        if self._error is not None:
            return f"The engine loop died ({type(self._error).__name__}: {self._error}); restart the server."
        return "The engine is shutting down and accepts no new requests."

    # ------------------------------------------------------------------------------------------
    # the engine thread

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                commands = []
                if not engine.has_unfinished_requests():
                    self._publish_stats(force=True)
                    commands.append(self._inbox.get())  # idle: block until there is something to do
                while True:
                    try:
                        commands.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                deliveries: list[tuple[RequestStream, Any]] = []
                for command in commands:
                    if command is _STOP:
                        self._stop_all(deliveries)
                        self._deliver(deliveries)
                        return
                    self._handle(command, deliveries)
                if engine.has_unfinished_requests():
                    try:
                        outputs = engine.step()
                    except Exception as exc:
                        logger.exception(
                            "engine.step() failed; failing the %d requests in flight", len(self._streams)
                        )
                        self._fail_all(exc, deliveries)
                    else:
                        self.num_steps += 1
                        if self.metrics is not None:
                            self.metrics.engine_steps.inc()
                        self._route(outputs, deliveries)
                # Stats first: a client that just got its last token and then scrapes /metrics must see them.
                self._publish_stats(force=not engine.has_unfinished_requests())
                self._deliver(deliveries)
                # Hand the GIL over between steps, so the HTTP thread can stream these outputs and bring in
                # new requests (they join the next step's batch) instead of waiting for a forced switch.
                time.sleep(0)
        except BaseException as exc:  # a bug in this loop: die loudly, never hang the clients
            logger.exception("The engine loop died")
            self._error = exc
            deliveries = []
            self._stop_all(deliveries, EngineDeadError(self._dead_message()))
            self._deliver(deliveries)

    def _handle(self, command: tuple[Any, ...], deliveries: list[tuple[RequestStream, Any]]) -> None:
        if command[0] == "add":
            _, request_id, prompt, params, arrival, stream = command
            if request_id in self._streams:
                deliveries.append((stream, ValueError(f"Request id {request_id!r} is already in use.")))
                return
            try:
                self.engine.add_request(request_id, prompt, params, arrival_time=arrival)
            except ValueError as exc:  # the request's fault: its message is for the client
                deliveries.append((stream, exc))
                return
            except Exception as exc:  # the engine's fault: log it, fail this request only
                logger.exception("engine.add_request failed")
                why = f"{type(exc).__name__}: {exc}"
                error = EngineError(f"The engine could not accept this request ({why}).")
                deliveries.append((stream, error))
                return
            self._streams[request_id] = stream
            if self.metrics is not None:
                self.metrics.on_add(request_id, arrival)
            deliveries.append((stream, _ACCEPTED))
        elif command[0] == "abort":
            ids = [rid for rid in command[1] if rid in self._streams]
            if not ids:
                return
            try:
                self.engine.abort_request(ids)
            except Exception:
                logger.exception("engine.abort_request failed")
            for rid in ids:
                stream = self._streams.pop(rid)
                deliveries.append((stream, EngineError(f"Request {rid} was aborted.")))
                if self.metrics is not None:
                    self.metrics.on_abort(rid)

    def _route(self, outputs: list[RequestOutput], deliveries: list[tuple[RequestStream, Any]]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if output.finished:
                del self._streams[output.request_id]
            deliveries.append((stream, output))
        if self.metrics is not None:
            try:
                self.metrics.on_outputs(outputs)
            except Exception:
                logger.exception("Recording metrics failed")

    def _fail_all(self, exc: BaseException, deliveries: list[tuple[RequestStream, Any]]) -> None:
        ids = list(self._streams)
        with contextlib.suppress(Exception):
            self.engine.abort_request(ids)
        error = EngineError(f"The engine failed while computing this request ({type(exc).__name__}: {exc}).")
        for rid in ids:
            deliveries.append((self._streams.pop(rid), error))
            if self.metrics is not None:
                self.metrics.on_error(rid)

    def _stop_all(
        self, deliveries: list[tuple[RequestStream, Any]], error: BaseException | None = None
    ) -> None:
        error = error or EngineDeadError("The engine was shut down before this request finished.")
        ids = list(self._streams)
        if ids:
            with contextlib.suppress(Exception):
                self.engine.abort_request(ids)
        for rid in ids:
            deliveries.append((self._streams.pop(rid), error))
            if self.metrics is not None:
                self.metrics.on_abort(rid)
        # Requests still in the inbox were never added: refuse them too.
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, tuple) and command[0] == "add":
                deliveries.append((command[-1], error))
        self._publish_stats(force=True)

    def _deliver(self, deliveries: list[tuple[RequestStream, Any]]) -> None:
        if not deliveries:
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed under us (process exit)
            loop.call_soon_threadsafe(_deliver_batch, deliveries)

    def _publish_stats(self, force: bool = False) -> None:
        if self.metrics is None:
            return
        now = time.monotonic()
        if not force and now - self._last_stats_time < self._stats_interval_s:
            return
        self._last_stats_time = now
        try:
            self.metrics.on_stats(self.engine.get_stats())
        except Exception:
            logger.exception("Reading engine stats failed")


def _vocab_size(engine: Any) -> int | None:
    """The model's vocabulary size (its embedding rows), else the tokenizer's; None when neither is known."""
    hf_config = getattr(getattr(engine, "model_config", None), "hf_config", None)
    size = getattr(hf_config, "vocab_size", None)
    if isinstance(size, int):
        return size
    tokenizer = getattr(engine, "tokenizer", None)
    return len(tokenizer) if tokenizer is not None else None


def _deliver_batch(deliveries: list[tuple[RequestStream, Any]]) -> None:
    for stream, item in deliveries:
        stream._put(item)
