"""AsyncLLM: an asyncio front end over an :class:`LLMEngine` that runs in its own process.

Process model
-------------
The engine lives in a child process (``brisk-engine``, started with the "spawn" context; its loop is
:class:`brisk.engine.core_process.EngineCore`), so scheduling, the model's step, detokenization and building
outputs never compete with the HTTP server for the GIL. This process keeps what the server needs next to the
event loop: its own copy of the tokenizer (loaded from the path the child reports), ``max_model_len``, the
model's sampling defaults, the metrics, and one :class:`RequestStream` per request.

* Commands (add / abort / stop) are batched per event-loop iteration and written to the child's pipe by a
  sender thread, so a child busy with a long step never blocks the event loop.
* A reader thread receives the child's messages (one per engine step, carrying all of that step's outputs as
  deltas), rebuilds the cumulative :class:`RequestOutput`\\ s, records the metrics, and hands the step's
  deliveries to the requests' ``asyncio.Queue``\\ s with one ``loop.call_soon_threadsafe`` per message.

The child drains the commands between steps and blocks on its pipe when idle (no polling). Every request that
is running at a step is computed in that step, so concurrent streams are batched together (continuous batching
is the scheduler's job; this class only keeps it fed).

Failure model: ``add_request`` errors (bad prompt, ...) are raised to the caller of :meth:`AsyncLLM.add_request`
only; an exception from ``engine.step()`` fails the requests in flight (each gets an :class:`EngineError`) and
the loop carries on; an error outside those (a bug in the loop) ends the child, and so does a crash or a kill:
then :attr:`is_alive` is false, the requests in flight get :class:`EngineDeadError` and new ones are refused.
The child exits by itself when this process goes away (end of file on its pipe).

"spawn" starts a fresh interpreter that re-imports the main module: a script of your own that creates an
``AsyncLLM`` must do it under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import multiprocessing
import queue
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from brisk.engine import core_process
from brisk.engine.request_stream import ACCEPTED, RequestStream, RequestTimeoutError
from brisk.engine.tokenizer import load_tokenizer, load_tokenizer_in_background
from brisk.engine.tokenizer_snapshot import SnapshotTokenizer
from brisk.outputs import RequestOutput
from brisk.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger("brisk.engine")

__all__ = [
    "AsyncLLM",
    "EngineDeadError",
    "EngineError",
    "EngineStalledError",
    "QueueFullError",
    "RequestStream",
    "RequestTimeoutError",
]


class EngineError(RuntimeError):
    """The engine failed while computing a request (not the request's fault)."""


class EngineDeadError(EngineError):
    """The engine loop is not running (stopped, or died); no request can be served."""


class EngineStalledError(EngineError):
    """The engine has requests to serve but has sent no heartbeat, or completed no step, within its timeouts."""


class QueueFullError(RuntimeError):
    """Too many requests are waiting for the engine; retry later."""


SHUTDOWN_MESSAGE = "The engine was shut down before this request finished."


class _CallWaiter:
    """Where the result of :meth:`AsyncLLM.call_engine` is delivered (like a stream, through ``_put``)."""

    def __init__(self, future: asyncio.Future):
        self.future = future

    def _put(self, item: Any) -> None:
        if self.future.done():
            return
        if isinstance(item, BaseException):
            self.future.set_exception(item)
        else:
            self.future.set_result(item)


class AsyncLLM:
    """Runs an ``LLMEngine`` built from ``engine_args`` in a child process and serves requests to asyncio code.

    The constructor starts the process and returns once the engine is ready; an engine that cannot start
    raises the child's error here (``ValueError``, ``FileNotFoundError``, ``RuntimeError``, ... with its
    message). ``engine_cls`` picks another engine class (a subclass of ``LLMEngine``, given as an importable
    class or ``"module:Class"``; tests use it to inject faults).

    ``max_waiting_requests`` bounds the requests accepted but not yet producing tokens (on their way to the
    engine, waiting in the scheduler or in their prefill); beyond it :meth:`add_request` raises
    :class:`QueueFullError`.

    Heartbeat: the engine process reports after every step, and a thread of its own sends a heartbeat every
    second whatever the loop is doing (a long step included). While requests are in flight, the engine is
    *stalled* when no heartbeat has come for ``stall_timeout_s`` (the process is stopped or wedged) or no step
    has completed for ``step_timeout_s`` (the loop is stuck); then :attr:`is_stalled` is true and new requests
    get :class:`EngineStalledError`. It clears by itself when the engine reports again. An idle engine is
    never stalled.
    """

    def __init__(
        self,
        engine_args: Any,
        *,
        engine_cls: Any = None,
        max_waiting_requests: int | None = None,
        metrics: Any | None = None,
        stats_interval_s: float = 0.1,
        stall_timeout_s: float | None = None,
        step_timeout_s: float | None = None,
    ):
        self.engine_args = engine_args
        self.max_waiting_requests = max_waiting_requests
        self.stall_timeout_s = stall_timeout_s
        self.step_timeout_s = step_timeout_s
        # Heartbeat (monotonic clock): the engine's last message, its last step, and when it last went busy.
        self._last_heartbeat = self._last_step = self._busy_since = time.monotonic()
        self.metrics = metrics
        self.tokenizer: Any = None
        self.max_model_len: int = 0
        # Sampling defaults of requests that leave them out (engine/generation_defaults.py).
        self.default_sampling_fields: dict[str, Any] = {}
        self.vocab_size: int | None = None
        self.engine_pid: int | None = None
        self.engine_gc_frozen_objects = 0  # objects start-up left in the engine process, out of the collector's reach
        self.last_stats: Any = None  # the engine's latest EngineStats
        self.num_steps = 0
        self._streams: dict[str, Any] = {}  # request id (or call id) -> RequestStream / _CallWaiter
        self._num_waiting = 0  # loop thread only
        self._num_in_flight = 0  # loop thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._pending: list[tuple[Any, ...]] = []  # commands of this event-loop iteration, not yet handed over
        self._outbox: queue.SimpleQueue[list[tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._call_ids = itertools.count()
        self._error: str | None = None  # why the engine died
        self._stopped = False  # shutdown() was called
        self._stop_sent = False
        self._gone = False  # the engine process has exited (reader thread saw the end of its pipe)
        self._proc: Any = None
        self._start_process(engine_args, engine_cls, stats_interval_s)

    @classmethod
    def from_engine_args(cls, engine_args: Any, **kwargs: Any) -> AsyncLLM:
        return cls(engine_args, **kwargs)

    # ------------------------------------------------------------------------------------------
    # the engine process

    def _start_process(self, engine_args: Any, engine_cls: Any, stats_interval_s: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        cmd_recv, cmd_send = ctx.Pipe(duplex=False)
        out_recv, out_send = ctx.Pipe(duplex=False)
        self._cmd_conn, self._out_conn = cmd_send, out_recv
        self._proc = ctx.Process(
            target=core_process.run_engine_core,
            name="brisk-engine",
            args=(engine_args, engine_cls, cmd_recv, out_send, _log_config(), stats_interval_s),
            daemon=True,  # terminated at exit if we never got to shut it down
        )
        try:
            self._proc.start()
            # Our copies of the child's ends are closed, so its exit reads as the end of its pipe here.
            cmd_recv.close()
            out_send.close()
            preload = _TokenizerPreload(engine_args)  # overlaps with the child's startup
            try:
                message = self._out_conn.recv()
            except EOFError:
                self._proc.join(5)
                raise RuntimeError(
                    f"The engine process exited during startup ({_describe_exit(self._proc.exitcode)}); "
                    "see the log above."
                ) from None
            if message[0] == core_process.FAILED:
                raise _startup_error(message[1])
            info = message[1]
            self.max_model_len = info["max_model_len"]
            self.default_sampling_fields = info["default_sampling_fields"]
            self.vocab_size = info["vocab_size"]
            self.engine_pid = info["pid"]
            self.engine_gc_frozen_objects = info["gc_frozen_objects"]
            if info["has_tokenizer"]:
                self.tokenizer = preload.get(info["tokenizer_path"])
        except BaseException as exc:
            self._kill(timeout_s=0 if isinstance(exc, KeyboardInterrupt) else 5)
            raise

    def _kill(self, timeout_s: float = 5.0) -> None:
        """Make sure the engine process is gone and reaped: close its command pipe (it exits at the end of
        file), wait up to ``timeout_s``, then terminate, then kill."""
        with contextlib.suppress(Exception):
            self._cmd_conn.close()
        proc = self._proc
        if proc is not None and proc.pid is not None:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        if self._reader is None:  # else the reader thread owns it (and ends at its end of file)
            with contextlib.suppress(Exception):
                self._out_conn.close()

    # ------------------------------------------------------------------------------------------
    # lifecycle (call from the event loop)

    def start(self) -> None:
        if self._reader is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._reader = threading.Thread(target=self._read, name="brisk-engine-reader", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="brisk-engine-sender", daemon=True)
        self._reader.start()
        self._sender.start()

    @property
    def is_alive(self) -> bool:
        return (
            self._reader is not None
            and not self._stopped
            and self._error is None
            and not self._gone
            and self._proc.is_alive()
        )

    @property
    def num_in_flight(self) -> int:
        return self._num_in_flight

    def _busy_for(self, since: float) -> float:
        if not self._num_in_flight:
            return 0.0
        return time.monotonic() - max(since, self._busy_since)

    @property
    def seconds_without_heartbeat(self) -> float:
        """Seconds without any message from the engine process while requests are in flight (0 while idle)."""
        return self._busy_for(self._last_heartbeat)

    @property
    def seconds_without_step(self) -> float:
        """Seconds since the engine last completed a step while requests are in flight (0 while idle)."""
        return self._busy_for(self._last_step)

    def stall_reason(self) -> str | None:
        """Why the engine is stalled (a sentence), or None."""
        silent, stepless = self.seconds_without_heartbeat, self.seconds_without_step
        if self.stall_timeout_s is not None and silent > self.stall_timeout_s:
            why = f"the engine process has not answered for {silent:.1f} s (stall timeout {self.stall_timeout_s:g} s)"
        elif self.step_timeout_s is not None and stepless > self.step_timeout_s:
            why = f"the engine has completed no step for {stepless:.1f} s (step timeout {self.step_timeout_s:g} s)"
        else:
            return None
        return f"The engine is stalled: {why}, with {self._num_in_flight} requests in flight."

    @property
    def is_stalled(self) -> bool:
        return self.stall_reason() is not None

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine process; requests still in flight end with :class:`EngineDeadError`."""
        self._stopped = True
        if not self._stop_sent:
            self._stop_sent = True
            self._send(("stop",))
            self._flush()
        deadline = time.monotonic() + timeout_s
        reader = self._reader
        while ((reader is not None and reader.is_alive()) or self._proc.is_alive()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._proc.is_alive():
            logger.warning("The engine process did not stop within %.1f s: terminating it", timeout_s)
        self._kill(timeout_s=0)
        self._outbox.put(None)  # ends the sender thread

    # ------------------------------------------------------------------------------------------
    # requests (call from the event loop)

    async def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | Mapping,
        params: SamplingParams,
        arrival_time: float | None = None,
        timeout_s: float | None = None,
    ) -> RequestStream:
        """Submit a request; returns once the engine has accepted it.

        Raises ``ValueError`` (the engine rejected the request: its message is for the client),
        :class:`QueueFullError`, :class:`EngineDeadError`, :class:`EngineStalledError`, or
        :class:`RequestTimeoutError` when ``timeout_s`` passes first (the same deadline then bounds the stream).
        """
        (stream,) = await self.add_requests([(request_id, prompt, params)], arrival_time, timeout_s)
        return stream

    async def add_requests(
        self,
        requests: list[tuple[str, str | list[int] | Mapping, SamplingParams]],
        arrival_time: float | None = None,
        timeout_s: float | None = None,
    ) -> list[RequestStream]:
        """Submit ``(request_id, prompt, params)`` requests together: one message to the engine, one wait for
        all of them to be accepted (a list of prompts costs one round trip, not one per prompt). All or
        nothing: if the engine rejects one, the others are aborted and that error is raised. The queue limit
        is checked once, for the first request: a batch is admitted whole."""
        if self._reader is None:
            self.start()
        if not self.is_alive:
            raise EngineDeadError(self._dead_message())
        stalled = self.stall_reason()
        if stalled is not None:
            raise EngineStalledError(stalled)
        if self.max_waiting_requests is not None and self._num_waiting >= self.max_waiting_requests:
            raise QueueFullError(
                f"The server is overloaded: {self._num_waiting} requests are already waiting "
                f"(--max-waiting-requests {self.max_waiting_requests}). Retry later."
            )
        ids = [request_id for request_id, _, _ in requests]
        taken = next((i for i in ids if i in self._streams), None)
        if taken is not None or len(set(ids)) < len(ids):
            raise ValueError(f"Request id {taken or ids!r} is already in use.")
        arrival = arrival_time or time.time()
        if not self._num_in_flight:
            self._busy_since = time.monotonic()
        streams = []
        for request_id, prompt, params in requests:
            delta = params.output_kind is RequestOutputKind.DELTA
            stream = RequestStream(request_id, self, prompt, arrival, timeout_s, delta=delta)
            stream._waiting_counted = stream._in_flight = True
            self._num_waiting += 1
            self._num_in_flight += 1
            self._streams[request_id] = stream
            if delta:  # the engine process sends what changed of cumulative outputs; the stream cuts the deltas
                params = replace(params, output_kind=RequestOutputKind.CUMULATIVE)
            self._send(("add", request_id, prompt, params, arrival))
            streams.append(stream)
        error: BaseException | None = None
        try:
            for stream in streams:
                first = await stream.first_item()
                if first is not ACCEPTED:
                    stream.finished = True
                    error = error or first
        except BaseException:
            for stream in streams:
                stream.abort()
            raise
        if error is not None:
            for stream in streams:
                stream.abort()
            raise error
        return streams

    async def generate(
        self, prompt: str | list[int] | Mapping, params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Convenience: add a request and yield its outputs (as ``params.output_kind`` says: cumulative, only
        what is new, or only the final one); aborts it if the caller stops early."""
        stream = await self.add_request(request_id, prompt, params)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    def abort(self, request_ids: str | Iterable[str]) -> None:
        """Abort requests (safe from any thread); their streams end with :class:`EngineError`."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        if not ids or self._gone:
            return
        if threading.get_ident() == self._loop_thread or self._loop is None:
            self._send(("abort", ids))
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is left to abort
                self._loop.call_soon_threadsafe(self._send, ("abort", ids))

    async def call_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``engine.method(*args, **kwargs)`` in the engine process, between two steps; returns its (picklable)
        result. For tests and diagnostics: an exception in the call is raised here as :class:`EngineError`."""
        if self._reader is None:
            self.start()
        if not self.is_alive:
            raise EngineDeadError(self._dead_message())
        call_id = f"call-{next(self._call_ids)}"
        future = asyncio.get_running_loop().create_future()
        self._streams[call_id] = _CallWaiter(future)
        self._send(("call", call_id, method, args, kwargs))
        return await future

    def _dead_message(self) -> str:
        if self._error is not None:
            return f"The engine {self._error}; restart the server."
        if not self._stopped and self._reader is not None and not self._proc.is_alive():  # not yet seen by the reader
            return f"The engine process died unexpectedly ({_describe_exit(self._proc.exitcode)}); restart the server."
        return "The engine is shutting down and accepts no new requests."

    # ------------------------------------------------------------------------------------------
    # commands: batched per event-loop iteration, written by the sender thread

    def _send(self, command: tuple[Any, ...]) -> None:
        self._pending.append(command)
        if len(self._pending) == 1:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon(self._flush)
            else:
                self._flush()

    def _flush(self) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            if self._sender is not None:
                self._outbox.put(batch)
            else:  # not started: write it ourselves
                self._write(batch)

    def _send_loop(self) -> None:
        outbox = self._outbox
        while True:
            batch = outbox.get()
            if batch is None:
                return
            done = False
            while True:
                try:
                    more = outbox.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    done = True
                    break
                batch.extend(more)
            self._write(batch)
            if done:
                return

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        try:
            self._cmd_conn.send(batch)
        except OSError:
            pass  # the engine process is gone: the reader thread reports it
        except Exception:
            if self._gone or self._stop_sent:  # the pipe was closed under us: nobody is listening
                return
            if len(batch) > 1:  # one command could not be pickled: send the others, fail that one
                for command in batch:
                    self._write([command])
                return
            logger.exception("Sending a command to the engine process failed")
            command = batch[0]
            stream = self._streams.pop(command[1], None) if command[0] in ("add", "call") else None
            if stream is not None:
                why = f"{type(sys.exc_info()[1]).__name__}: {sys.exc_info()[1]}"
                error = EngineError(f"The request could not be sent to the engine ({why}).")
                self._deliver([(stream, error)])

    # ------------------------------------------------------------------------------------------
    # the reader thread

    def _read(self) -> None:
        conn = self._out_conn
        try:
            while True:
                message = conn.recv()
                kind = message[0]
                self._last_heartbeat = time.monotonic()
                if kind == core_process.HEARTBEAT:
                    continue
                if kind == core_process.STEP:
                    if message[3]:  # a step was run (not only commands handled)
                        self._last_step = self._last_heartbeat
                    self._on_step(message[1], message[2], message[3])
                elif kind == core_process.DEAD:
                    self._error = f"loop died ({message[1]})"
                elif kind == core_process.STOPPED:
                    pass  # the end of the pipe follows
        except (EOFError, OSError):
            pass
        except BaseException:
            logger.exception("Reading from the engine process failed")
            if self._error is None:
                self._error = "process could not be read from"
        finally:
            self._on_engine_gone()

    def _on_step(self, events: list[tuple[Any, ...]], stats: Any, stepped: bool) -> None:
        """One step of the engine: rebuild its outputs, record the metrics, hand the step to the event loop."""
        streams, record = self._streams, self._record
        deliveries: list[tuple[Any, Any]] = []
        outputs: list[RequestOutput] = []
        for event in events:
            kind, rid = event[0], event[1]
            if kind == "out":
                stream = streams.get(rid)
                if stream is None:
                    continue
                output = stream._assemble(event)
                if output.finished:
                    del streams[rid]
                deliveries.append((stream, output))
                outputs.append(output)
                continue
            if outputs:  # keep the metrics in the engine's order
                record("on_outputs", outputs)
                outputs = []
            stream = streams.get(rid) if kind == "accepted" else streams.pop(rid, None)
            if stream is None:
                continue
            if kind == "accepted":
                deliveries.append((stream, ACCEPTED))
                record("on_add", rid, stream.arrival_time)
            elif kind == "rejected":
                deliveries.append((stream, _rejection(event[2], event[3])))
            elif kind == "failed":
                deliveries.append((stream, EngineError(event[2])))
                record("on_error", rid)
            elif kind == "aborted":
                deliveries.append((stream, EngineError(f"Request {rid} was aborted.")))
                record("on_abort", rid)
            elif kind == "shutdown":
                deliveries.append((stream, EngineDeadError(SHUTDOWN_MESSAGE)))
                record("on_abort", rid)
            elif kind == "result":
                ok, value = event[2], event[3]
                deliveries.append((stream, value if ok else EngineError(value)))
        if outputs:
            record("on_outputs", outputs)
        if stepped:
            self.num_steps += 1
            if self.metrics is not None:
                self.metrics.engine_steps.inc()
        if stats is not None:
            self.last_stats = stats
            record("on_stats", stats)
        # Metrics first: a client that just got its last token and then scrapes /metrics must see them.
        self._deliver(deliveries)

    def _record(self, hook: str, *args: Any) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        try:
            getattr(metrics, hook)(*args)
        except Exception:
            logger.exception("Recording metrics failed")

    def _deliver(self, deliveries: list[tuple[Any, Any]]) -> None:
        if not deliveries:
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed under us (process exit)
            loop.call_soon_threadsafe(_deliver_batch, deliveries)

    def _on_engine_gone(self) -> None:
        """The engine process has exited, or cannot be read from: end everything still waiting on it."""
        proc = self._proc
        if not self._stop_sent:  # after a stop, shutdown() waits for the process to exit
            proc.join(2.0)  # it has closed its pipe: it is exiting (and the exit code tells how)
            if self._error is None:
                self._error = f"process died unexpectedly ({_describe_exit(proc.exitcode)})"
                logger.error("The engine process died unexpectedly (%s)", _describe_exit(proc.exitcode))
            if proc.is_alive():  # we cannot read it any more: it is of no use
                proc.terminate()
        self._gone = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._fail_leftovers)
                return
        self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        """Loop thread (no add_request can interleave): every stream and call not ended by the engine."""
        error = EngineDeadError(self._dead_message() if self._error is not None else SHUTDOWN_MESSAGE)
        leftovers = list(self._streams.items())
        self._streams.clear()
        for rid, stream in leftovers:
            stream._put(error)
            if isinstance(stream, RequestStream):
                self._record("on_abort" if self._error is None else "on_error", rid)
        if self._error is not None:
            self._record("on_stats", SimpleNamespace(num_running=0, num_waiting=0, kv_cache_usage=0.0))


# ------------------------------------------------------------------------------------------


def _deliver_batch(deliveries: list[tuple[Any, Any]]) -> None:
    for stream, item in deliveries:
        stream._put(item)


def _rejection(kind: str, message: str) -> BaseException:
    if kind == "value":
        return ValueError(message)
    if kind == "dead":
        return EngineDeadError(message)
    return EngineError(message)


def _startup_error(error: dict[str, str]) -> BaseException:
    """The child's startup exception, re-created for the CLI's one-line report."""
    base = getattr(builtins, error.get("base") or "", None)
    if isinstance(base, type) and issubclass(base, Exception):
        with contextlib.suppress(Exception):
            return base(error["message"])
    return RuntimeError(f"The engine failed to start ({error['type']}: {error['message']}).")


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
        return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _log_config() -> dict[str, Any] | None:
    """The root logger's level and the first handler's format, for the engine process to log alike."""
    root = logging.getLogger()
    if not root.handlers:
        return None
    formatter = next((h.formatter for h in root.handlers if h.formatter is not None), None)
    return {
        "level": root.getEffectiveLevel(),
        "format": getattr(formatter, "_fmt", None),
        "datefmt": getattr(formatter, "datefmt", None),
    }


class _TokenizerPreload:
    """Loads, in a thread and while the engine process starts, the tokenizer the engine will most likely
    report (``--tokenizer``, or the model when it is an HF folder); :meth:`get` returns the one it reports.

    The HTTP side needs its own copy of the engine's tokenizer (tokenizing, chat templates). It is the engine's
    snapshot where there is one (``tokenizer_snapshot.py``), whose chat-template renderer is built here too, so
    that neither waits for transformers' tokenizer classes; either way the load overlaps with the child's
    startup instead of following it."""

    def __init__(self, engine_args: Any):
        self._guess = _guess_tokenizer_path(engine_args)
        self._trust_remote_code = bool(getattr(engine_args, "trust_remote_code", False))
        self._loading: Future | None = None
        if self._guess is not None:
            with contextlib.suppress(ValueError):  # no tokenizer there: get() reports it, if the engine agrees
                self._loading = load_tokenizer_in_background(
                    self._guess, trust_remote_code=self._trust_remote_code, use_snapshot=True
                )
                self._loading.add_done_callback(_prepare_chat_templates)

    def get(self, path: str | None) -> Any:
        if path is None:
            return None
        if path == self._guess and self._loading is not None:
            with contextlib.suppress(Exception):  # loaded again below, for the error to name what went wrong
                return self._loading.result()
        return load_tokenizer(path, trust_remote_code=self._trust_remote_code, use_snapshot=True)


def _prepare_chat_templates(loading: Future) -> None:
    """Build a snapshot's chat-template renderer on the loading thread, before the first chat request."""
    tokenizer = None if loading.exception() is not None else loading.result()
    if isinstance(tokenizer, SnapshotTokenizer) and tokenizer.chat_template is not None:
        try:
            tokenizer.chat_renderer()
        except Exception as exc:  # the first chat request tries again, and reports what fails
            logger.warning("could not prepare the chat template of %s (%s)", tokenizer.name_or_path, exc)


def _guess_tokenizer_path(engine_args: Any) -> str | None:
    """The path the engine loads its tokenizer from, when it is plain to see (else None)."""
    tokenizer = getattr(engine_args, "tokenizer", None)
    if tokenizer:
        return str(tokenizer)
    model = getattr(engine_args, "model", None)
    if model is None:
        return None
    path = Path(str(model).strip()).expanduser()
    return str(path) if (path / "config.json").is_file() else None
