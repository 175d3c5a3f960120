"""The engine process of ``brisk serve``: the :class:`LLMEngine` and its loop, away from the HTTP server's GIL.

:class:`~brisk.engine.async_engine.AsyncLLM` starts :func:`run_engine_core` in a child process (the "spawn"
context: the parent never forks after touching CUDA, and the child inherits no sockets) and talks to it over
two one-way pipes of pickled messages:

* commands, parent -> child, in lists (one list per batch the parent sends)::

      ("add", request_id, prompt, params, arrival_time)
      ("abort", [request_id, ...])
      ("call", call_id, method, args, kwargs)   # engine.method(*args, **kwargs), for tests and diagnostics
      ("stop",)

* messages, child -> parent: first ``("ready", info)`` or ``("failed", error)``; then one ``("step", events,
  stats, stepped)`` per loop iteration that has something to report, and a ``("heartbeat",)`` every
  ``HEARTBEAT_INTERVAL_S`` from a thread of its own (so the parent can tell a frozen or dead process from a
  long step: a thread runs while torch computes); last ``("stopped",)`` after a stop, or ``("dead", why)`` when
  the loop itself broke. ``events`` is ordered and holds tuples tagged:

      ("accepted", request_id)
      ("rejected", request_id, kind, message)   # kind: "value" (the request's fault), "engine", "dead"
      ("out", request_id, finished, completions, metrics, num_cached_tokens, prompt_token_ids, prompt_logprobs)
      ("failed", request_id, message)           # engine.step() raised: the request was aborted
      ("aborted", request_id)
      ("shutdown", request_id)                  # the engine stopped before the request finished
      ("result", call_id, ok, value)

Outputs travel as *deltas* (:class:`OutputDeltas`): the new text, token ids and logprobs of each completion since
the previous output of the request, plus the prompt's token ids once (only for text prompts, which the parent
did not tokenize itself). The parent rebuilds the cumulative :class:`RequestOutput` (``async_engine``). Cumulative
outputs (full text and token ids, and the prompt's ids, every step) cost ~10 ms a step to pickle at 256 requests
and more to unpickle; deltas cost about 1 ms (a few microseconds each).

The loop has the semantics of the former engine thread: commands are drained between steps, the process blocks
on its pipe when idle (no polling), an exception from ``engine.step()`` fails the requests in flight and the loop
carries on (unless the exception is marked ``fatal``, as a dead worker process is: then the loop ends), and an error
anywhere else ends it with ``("dead", why)``. The child exits when its parent goes away
(end of file on the command pipe, or a broken output pipe) and ignores SIGINT: Ctrl+C reaches the whole process
group, and the server decides how to shut down.

This module stays light at import time (no torch): the engine is imported in the child only.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
from typing import Any

logger = logging.getLogger("brisk.engine")

READY, FAILED, STEP, STOPPED, DEAD, HEARTBEAT = "ready", "failed", "step", "stopped", "dead", "heartbeat"
HEARTBEAT_INTERVAL_S = 1.0

# Exception types the parent re-creates (with the child's message) when the engine fails to start, so the CLI
# reports them as it always did ("brisk serve: error: ..."); anything else becomes a RuntimeError naming its type.
STARTUP_ERROR_TYPES = (
    "FileNotFoundError",
    "NotADirectoryError",
    "IsADirectoryError",
    "PermissionError",
    "ValueError",
    "RuntimeError",
    "NotImplementedError",
    "MemoryError",
)


class _ParentGone(Exception):
    """The parent closed its end of a pipe: it exited or shut us down; nobody is left to serve."""


def engine_class(spec: Any) -> type:
    """The engine class from ``spec``: None (``LLMEngine``), a class, or ``"package.module:ClassName"``."""
    if spec is None:
        from brisk.engine.engine import LLMEngine

        return LLMEngine
    if isinstance(spec, type):
        return spec
    module_name, sep, qualname = str(spec).partition(":")
    if not sep:
        module_name, _, qualname = module_name.rpartition(".")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def run_engine_core(
    engine_args: Any,
    engine_cls: Any,
    cmd_conn: Any,
    out_conn: Any,
    log_config: dict[str, Any] | None,
    stats_interval_s: float,
) -> None:
    """The child process's target: build the engine, report ready (or why not), run the loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _configure_logging(log_config)
    try:
        engine = engine_class(engine_cls).from_engine_args(engine_args)
        info = ready_info(engine) | {"gc_frozen_objects": freeze_startup_heap()}
    except BaseException as exc:  # reported to the parent, which raises it; no traceback on stderr
        logger.debug("The engine failed to start", exc_info=True)
        with contextlib.suppress(Exception):
            out_conn.send((FAILED, describe_startup_error(exc)))
        return
    try:
        out_conn.send((READY, info))
    except OSError:
        return
    if EngineCore(engine, cmd_conn, out_conn, stats_interval_s).run() is False:
        sys.exit(1)


def freeze_startup_heap() -> int:
    """Put every object start-up left behind (modules, the model's wrappers, compiled kernels, the tokenizer)
    out of the garbage collector's reach, and return how many. A full collection walks every tracked object:
    150 ms for the 237,000 of brisk's imports alone on a 2-core CPU. Under load, allocations trigger one every
    few seconds, and in the engine loop it is a pause that every stream sees as one long inter-token gap; in
    the HTTP process it holds back every stream's chunks. Frozen objects are never collected (they live as long
    as the process anyway); what serving allocates later is collected as before. vLLM freezes its engine alike."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def ready_info(engine: Any) -> dict[str, Any]:
    """What the parent needs to serve: lengths, vocabulary size, and where to load the same tokenizer from."""
    tokenizer = getattr(engine, "tokenizer", None)
    tokenizer_path = None
    if tokenizer is not None:
        args = getattr(engine, "args", None)
        model_config = getattr(engine, "model_config", None)
        tokenizer_path = (
            getattr(tokenizer, "name_or_path", None)
            or getattr(args, "tokenizer", None)
            or getattr(model_config, "path", None)
        )
        tokenizer_path = str(tokenizer_path) if tokenizer_path else None
    return {
        "max_model_len": engine.max_model_len,
        "default_sampling_fields": getattr(engine, "default_sampling_fields", {}),
        "vocab_size": vocab_size(engine),
        "has_tokenizer": tokenizer is not None,
        "tokenizer_path": tokenizer_path,
        "pid": os.getpid(),
    }


def vocab_size(engine: Any) -> int | None:
    """The model's vocabulary size (its embedding rows), else the tokenizer's; None when neither is known."""
    hf_config = getattr(getattr(engine, "model_config", None), "hf_config", None)
    size = getattr(hf_config, "vocab_size", None)
    if isinstance(size, int):
        return size
    tokenizer = getattr(engine, "tokenizer", None)
    return len(tokenizer) if tokenizer is not None else None


def describe_startup_error(exc: BaseException) -> dict[str, str]:
    """``{"type", "base", "message"}``: ``base`` is the first type of ``STARTUP_ERROR_TYPES`` in its MRO."""
    base = next(
        (t.__name__ for t in type(exc).__mro__ if t.__module__ == "builtins" and t.__name__ in STARTUP_ERROR_TYPES),
        "",
    )
    return {"type": type(exc).__name__, "base": base, "message": str(exc)}


def _configure_logging(config: dict[str, Any] | None) -> None:
    """Log like the parent: same level and format, to the stderr this process inherited."""
    if not config:
        return
    logging.basicConfig(
        level=config.get("level", logging.WARNING),
        format=config.get("format") or logging.BASIC_FORMAT,
        datefmt=config.get("datefmt"),
        stream=sys.stderr,
    )


# ------------------------------------------------------------------------------------------
# outputs as deltas


class OutputDeltas:
    """What the parent already has of one request's outputs, to send it only what changed."""

    __slots__ = ("send_prompt", "texts", "num_tokens", "num_logprobs", "num_prompt_logprobs")

    def __init__(self, send_prompt: bool):
        self.send_prompt = send_prompt  # a text prompt: the parent needs the token ids the engine made of it
        self.texts: list[str] = []
        self.num_tokens: list[int] = []
        self.num_logprobs: list[int] = []
        self.num_prompt_logprobs = 0

    def event(self, out: Any) -> tuple[Any, ...]:
        """The ``("out", ...)`` event of ``out``. Each completion is ``(text, replace, new_token_ids,
        new_logprobs, cumulative_logprob, finish_reason, stop_reason)``: ``text`` extends the previous text,
        or replaces it when ``replace`` (text is not guaranteed to only grow)."""
        texts, num_tokens, num_logprobs = self.texts, self.num_tokens, self.num_logprobs
        prompt_token_ids = None
        if not texts:
            n = len(out.outputs)
            texts.extend([""] * n)
            num_tokens.extend([0] * n)
            num_logprobs.extend([0] * n)
            if self.send_prompt:
                prompt_token_ids = out.prompt_token_ids
        completions = []
        for i, c in enumerate(out.outputs):
            text, previous = c.text, texts[i]
            if text.startswith(previous):
                piece, replace = text[len(previous) :], False
            else:
                piece, replace = text, True
            texts[i] = text
            token_ids = c.token_ids
            new_ids = token_ids[num_tokens[i] :]
            num_tokens[i] = len(token_ids)
            new_logprobs = None
            if c.logprobs is not None:
                new_logprobs = c.logprobs[num_logprobs[i] :]
                num_logprobs[i] = len(c.logprobs)
            completions.append(
                (piece, replace, new_ids, new_logprobs, c.cumulative_logprob, c.finish_reason, c.stop_reason)
            )
        prompt_logprobs = None
        if out.prompt_logprobs is not None:
            prompt_logprobs = out.prompt_logprobs[self.num_prompt_logprobs :]
            self.num_prompt_logprobs = len(out.prompt_logprobs)
        m = out.metrics
        timings = (m.arrival_time, m.first_scheduled_time, m.first_token_time, m.last_token_time, m.finished_time)
        return (
            "out",
            out.request_id,
            out.finished,
            completions,
            timings,
            out.num_cached_tokens,
            prompt_token_ids,
            prompt_logprobs,
        )


# ------------------------------------------------------------------------------------------
# the loop


class EngineCore:
    """Runs ``engine`` for the parent at the other ends of ``cmd_conn`` (commands) and ``out_conn`` (outputs)."""

    def __init__(self, engine: Any, cmd_conn: Any, out_conn: Any, stats_interval_s: float = 0.1):
        self.engine = engine
        self.cmd_conn = cmd_conn
        self.out_conn = out_conn
        self.stats_interval_s = stats_interval_s
        self._live: dict[str, OutputDeltas] = {}  # requests accepted and not finished
        self._events: list[tuple[Any, ...]] = []
        self._last_stats_time = 0.0
        self._send_lock = threading.Lock()  # the loop and the heartbeat thread share the output pipe
        self._stopping = threading.Event()

    def _heartbeat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_INTERVAL_S):
            try:
                self._send((HEARTBEAT,))
            except Exception:  # the parent is gone, or the pipe is closing: the loop notices and exits
                return

    def run(self) -> bool:
        """Serve until stopped (True) or until the parent is gone (True); False when the loop itself broke."""
        engine = self.engine
        heartbeat = threading.Thread(target=self._heartbeat, name="brisk-engine-heartbeat", daemon=True)
        heartbeat.start()
        try:
            while True:
                commands = self._receive(block=not engine.has_unfinished_requests())
                for i, command in enumerate(commands):
                    if command[0] == "stop":
                        self._stop(commands[i + 1 :])
                        return True
                    self._handle(command)
                stepped = False
                if engine.has_unfinished_requests():
                    try:
                        outputs = engine.step()
                    except Exception as exc:
                        logger.exception("engine.step() failed; failing the %d requests in flight", len(self._live))
                        self._fail_all(exc)
                        if getattr(exc, "fatal", False):  # the engine cannot step again (e.g. a worker died)
                            raise
                    else:
                        stepped = True
                        self._route(outputs)
                # Stats are forced when the engine goes idle, so the last tokens' counters are never behind.
                self._flush(stepped, force_stats=not engine.has_unfinished_requests())
        except _ParentGone:
            return True
        except BaseException as exc:  # a bug in this loop: say so, and exit; the parent fails every request
            logger.exception("The engine loop died")
            with contextlib.suppress(Exception):
                self._flush(False, force_stats=False)
                self._send((DEAD, f"{type(exc).__name__}: {exc}"))
            return False
        finally:
            # Joined, not left to die with the interpreter: a daemon thread still running at exit made the
            # process abort ("terminate called without an active exception", exit code -6).
            self._stopping.set()
            heartbeat.join(timeout=2 * HEARTBEAT_INTERVAL_S)

    # ---- pipes ----------------------------------------------------------------------------------------------
    def _receive(self, block: bool) -> list[tuple[Any, ...]]:
        conn = self.cmd_conn
        commands: list[tuple[Any, ...]] = []
        try:
            if block:
                commands.extend(conn.recv())  # idle: wait for work (end of file when the parent is gone)
            while conn.poll():
                commands.extend(conn.recv())
        except (EOFError, OSError) as exc:
            raise _ParentGone from exc
        return commands

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self.out_conn.send(message)
        except (BrokenPipeError, EOFError, ConnectionResetError) as exc:
            raise _ParentGone from exc

    def _flush(self, stepped: bool, force_stats: bool) -> None:
        stats = self._stats(force_stats)
        if not self._events and stats is None and not stepped:
            return
        events, self._events = self._events, []
        self._send((STEP, events, stats, stepped))

    def _stats(self, force: bool) -> Any:
        now = time.monotonic()
        if not force and now - self._last_stats_time < self.stats_interval_s:
            return None
        self._last_stats_time = now
        try:
            return self.engine.get_stats()
        except Exception:
            logger.exception("Reading engine stats failed")
            return None

    # ---- commands -------------------------------------------------------------------------------------------
    def _handle(self, command: tuple[Any, ...]) -> None:
        kind = command[0]
        events = self._events
        if kind == "add":
            _, request_id, prompt, params, arrival = command
            try:
                self.engine.add_request(request_id, prompt, params, arrival_time=arrival)
            except ValueError as exc:  # the request's fault: its message is for the client
                events.append(("rejected", request_id, "value", str(exc)))
                return
            except Exception as exc:  # the engine's fault: log it, fail this request only
                logger.exception("engine.add_request failed")
                why = f"{type(exc).__name__}: {exc}"
                events.append(("rejected", request_id, "engine", f"The engine could not accept this request ({why})."))
                return
            self._live[request_id] = OutputDeltas(send_prompt=not isinstance(prompt, (list, tuple)))
            events.append(("accepted", request_id))
        elif kind == "abort":
            ids = [rid for rid in command[1] if rid in self._live]
            if not ids:
                return
            try:
                self.engine.abort_request(ids)
            except Exception:
                logger.exception("engine.abort_request failed")
            for rid in ids:
                del self._live[rid]
                events.append(("aborted", rid))
        elif kind == "call":
            _, call_id, method, args, kwargs = command
            try:
                result = getattr(self.engine, method)(*args, **kwargs)
                pickle.dumps(result)  # fail this call, not the message that carries it
            except Exception as exc:
                events.append(("result", call_id, False, f"{type(exc).__name__}: {exc}"))
            else:
                events.append(("result", call_id, True, result))
        else:
            raise ValueError(f"unknown engine command {kind!r}")

    def _route(self, outputs: list[Any]) -> None:
        events, live = self._events, self._live
        for out in outputs:
            deltas = live.get(out.request_id)
            if deltas is None:
                continue
            if out.finished:
                del live[out.request_id]
            events.append(deltas.event(out))

    def _fail_all(self, exc: BaseException) -> None:
        ids = list(self._live)
        with contextlib.suppress(Exception):
            self.engine.abort_request(ids)
        message = f"The engine failed while computing this request ({type(exc).__name__}: {exc})."
        self._live.clear()
        self._events.extend(("failed", rid, message) for rid in ids)

    def _stop(self, rest: list[tuple[Any, ...]]) -> None:
        """End every request (and refuse the adds that came with the stop), report, say goodbye."""
        ids = list(self._live)
        if ids:
            with contextlib.suppress(Exception):
                self.engine.abort_request(ids)
        self._live.clear()
        events = self._events
        events.extend(("shutdown", rid) for rid in ids)
        message = "The engine is shutting down and accepts no new requests."
        events.extend(("rejected", c[1], "dead", message) for c in rest if c[0] == "add")
        self._flush(False, force_stats=True)
        self._stopping.set()
        self._send((STOPPED,))
