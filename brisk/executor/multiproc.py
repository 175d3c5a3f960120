"""The multi-process executor: one worker process per rank (``worker_process.py``), joined by
``torch.distributed`` (gloo on CPUs, NCCL on GPUs). It has the model runner's interface, so the engine drives it as
it drives an in-process ``ModelRunner``.

Commands go down one pipe per worker, pickled once. A step sends the scheduler's batch as a ``StepMessage`` (the
changes since the last one) and reads the sampled tokens back from one rank (the last pipeline stage's first).
Every wait also watches each worker's process: a worker that dies, reports an error, or sends nothing within
``timeout_s`` stops the executor with an error naming the rank, and the other workers are stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import time
import weakref
from collections import deque
from collections.abc import Iterator
from multiprocessing import current_process, get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import torch

from brisk.config import ModelConfig
from brisk.engine.scheduler import SchedulerOutput
from brisk.engine.step_timer import StepTimer
from brisk.executor.step_sync import StepEncoder
from brisk.executor.worker_process import worker_main
from brisk.worker.model_runner import ModelRunnerOutput

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0  # a step, a command or start-up (loading weights) per rank; BRISK_WORKER_TIMEOUT_S


class WorkerFailedError(RuntimeError):
    """A worker process died, failed or stopped answering; the executor cannot continue."""

    fatal = True  # the engine cannot take another step: a server stops its engine loop


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_workers(processes: list[BaseProcess], conns: list[Connection]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):  # already closed, or the worker is gone
            conn.send_bytes(pickle.dumps(("shutdown", None)))
    deadline = time.monotonic() + 5
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1)
    for conn in conns:
        conn.close()


@contextlib.contextmanager
def _allow_children() -> Iterator[None]:
    """Let a daemonic process (the server's engine process) start the workers. multiprocessing refuses children
    of daemons because a daemon is killed without cleaning up after them; these children clean up after
    themselves: the executor's finalizer stops them, and each exits when its driver process is gone."""
    current = current_process()
    daemon = current.daemon
    current.daemon = False
    try:
        yield
    finally:
        current.daemon = daemon


class RemoteStep:
    """A step sent to the workers; ``result()`` waits for its sampled tokens."""

    def __init__(self, executor: MultiprocExecutor, schedule: SchedulerOutput):
        self.schedule = schedule
        self._executor = executor

    def result(self) -> ModelRunnerOutput:
        return self._executor._receive_step_result()


class MultiprocExecutor:
    def __init__(
        self,
        model_config: ModelConfig,
        device: torch.device,
        tensor_parallel_size: int,
        pipeline_parallel_size: int,
        runner_args: dict,
        timeout_s: float | None = None,
    ):
        self.world_size = tensor_parallel_size * pipeline_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
        self._result_rank = (pipeline_parallel_size - 1) * tensor_parallel_size  # the last stage's first rank
        self.timeout_s = timeout_s or float(os.environ.get("BRISK_WORKER_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        self.failure: str | None = None
        self._encoder = StepEncoder()
        self._inbox: list[deque] = [deque() for _ in range(self.world_size)]  # messages read ahead, per rank
        # CPU workers fork (they inherit the imported modules: seconds less per rank); CUDA cannot be forked.
        context = get_context("spawn" if device.type == "cuda" else "fork")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        # Steps each rank has taken from its pipe (shared memory, read only on a timeout to name the rank that hangs).
        self._steps_taken = context.Array("q", self.world_size, lock=False)
        self._steps_sent = 0
        self._conns: list[Connection] = []
        self._processes: list[BaseProcess] = []
        for rank in range(self.world_size):
            parent, child = context.Pipe()
            process = context.Process(
                target=worker_main,
                args=(
                    os.getpid(),
                    rank,
                    tensor_parallel_size,
                    pipeline_parallel_size,
                    init_method,
                    device.type,
                    model_config,
                    runner_args,
                    child,
                    self._steps_taken,
                    self.timeout_s,
                ),
                name=f"brisk-worker-{rank}",
                daemon=True,
            )
            with _allow_children():
                process.start()
            child.close()
            self._conns.append(parent)
            self._processes.append(process)
        self._finalizer = weakref.finalize(self, _stop_workers, self._processes, self._conns)
        for rank in range(self.world_size):
            self._receive(rank, "ok", "start-up")
        logger.info(
            "%d worker processes ready (tensor_parallel_size=%d, pipeline_parallel_size=%d)",
            self.world_size,
            tensor_parallel_size,
            pipeline_parallel_size,
        )

    # ---- the model runner's interface -------------------------------------------------------------------
    def kv_cache_bytes_per_block(self) -> int:
        """The largest rank's (pipeline stages may own different numbers of layers)."""
        return max(self._call("kv_cache_bytes_per_block"))

    def profile_available_kv_bytes(self, gpu_memory_utilization: float, max_num_batched_tokens: int) -> int:
        """Each rank measures its own device; all ranks then plan for the smallest."""
        return min(self._call("profile_available_kv_bytes", gpu_memory_utilization, max_num_batched_tokens))

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self._call("allocate_kv_cache", num_blocks)

    def init_step_buffers(self, max_num_batched_tokens: int, max_num_seqs: int, enforce_eager: bool) -> None:
        # CUDA graphs would capture a stage's send/recv: pipeline stages run eagerly.
        eager = enforce_eager or self.pipeline_parallel_size > 1
        self._call("init_step_buffers", max_num_batched_tokens, max_num_seqs, eager)

    def weight_bytes(self) -> int:
        """The largest rank's parameter bytes."""
        return max(self._call("weight_bytes"))

    def reseed_sampler(self, seed: int) -> None:
        self._call("reseed_sampler", seed)

    def execute(self, schedule: SchedulerOutput, timer: StepTimer) -> RemoteStep:
        self._send("step", self._encoder.encode(schedule))
        self._steps_sent += 1
        timer.mark("prepare")
        return RemoteStep(self, schedule)

    def shutdown(self) -> None:
        self._finalizer()

    # ---- messages ---------------------------------------------------------------------------------------
    def _send(self, kind: str, payload) -> None:
        self._check_alive()
        data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(data)
            except OSError:
                self._fail(f"worker rank {rank} is gone ({self._exit_status(rank)})")

    def _call(self, method: str, *args) -> list:
        self._send("call", (method, args))
        return [self._receive(rank, "ok", method) for rank in range(self.world_size)]

    def _receive_step_result(self) -> ModelRunnerOutput:
        self._check_alive()
        return self._receive(self._result_rank, "step", "a step")

    def _receive(self, rank: int, kind: str, what: str):
        """Wait for rank ``rank``'s next message (of ``kind``), watching every worker for errors and exits."""
        deadline = time.monotonic() + self.timeout_s
        sentinels = {process.sentinel: r for r, process in enumerate(self._processes)}
        while not self._inbox[rank]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(self._timeout_message(rank, what))
            ready = wait([*self._conns, *sentinels], timeout=remaining)
            for r, conn in enumerate(self._conns):  # errors first: a failing rank is named even if others answer
                if conn not in ready:
                    continue
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    continue  # the process is exiting: its sentinel names it
                if message[0] == "error":
                    dead = [d for d, process in enumerate(self._processes) if process.exitcode is not None]
                    if dead:  # a peer's death breaks the collectives of the living: name the dead one
                        self._fail(f"worker rank {dead[0]} died during {what} ({self._exit_status(dead[0])})")
                    self._fail(f"worker rank {r} failed during {what}:\n{message[1]}")
                self._inbox[r].append(message)
            for item in ready:
                if item in sentinels:
                    r = sentinels[item]
                    self._fail(f"worker rank {r} died during {what} ({self._exit_status(r)})")
        got, value = self._inbox[rank].popleft()
        if got != kind:
            self._fail(f"worker rank {rank} sent an unexpected {got!r} message during {what}")
        return value

    def _timeout_message(self, rank: int, what: str) -> str:
        late = [r for r in range(self.world_size) if self._steps_taken[r] < self._steps_sent]
        if what == "a step" and late:
            ranks = ", ".join(map(str, late))
            return f"worker rank {ranks} did not take step {self._steps_sent} within {self.timeout_s:.0f} s (hung?)"
        return f"worker rank {rank} sent no result for {what} within {self.timeout_s:.0f} s (hung?)"

    def _exit_status(self, rank: int) -> str:
        process = self._processes[rank]
        process.join(0.5)
        code = process.exitcode
        if code is None:
            return f"pid {process.pid} still running"
        return f"pid {process.pid}, exit code {code}" + (f" (signal {-code})" if code < 0 else "")

    def _check_alive(self) -> None:
        if self.failure is not None:
            raise WorkerFailedError(self.failure)

    def _fail(self, message: str):
        self.failure = message
        logger.error("%s; stopping the worker processes", message)
        self._finalizer()
        raise WorkerFailedError(message)
