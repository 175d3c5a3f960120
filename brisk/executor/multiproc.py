"""The multi-process executor: one worker process per rank (``worker_process.py``), joined by
``torch.distributed`` (gloo on CPUs, NCCL on GPUs). It has the model runner's interface, so the engine drives it as
it drives an in-process ``ModelRunner``.

Commands go down one pipe per worker, pickled once. A step sends the scheduler's batch as a ``StepMessage`` (the
changes since the last one) and reads the sampled tokens back from one rank (the last pipeline stage's first).
Every wait also watches each worker's process: a worker that dies, reports an error, or sends nothing within
``timeout_s`` stops the executor with an error naming the rank, and the other workers are stopped."""

from __future__ import annotations

import contextlib
import dataclasses
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
from brisk.executor.nodes import DEFAULT_MASTER_PORT, accept_remote_workers, local_ranks
from brisk.executor.step_sync import StepEncoder
from brisk.executor.worker_process import WorkerSpec, worker_main
from brisk.step_timer import StepTimer
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


def _stop_workers(processes: list[BaseProcess], conns: list[Connection], ray_ranks=None) -> None:
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
    if ray_ranks is not None:
        with contextlib.suppress(Exception):  # the cluster may be gone already
            ray_ranks.stop()


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


def start_workers(spec: WorkerSpec, ranks: range, with_pipes: bool):
    """Start one process per rank of ``ranks`` (this machine's). With pipes (node 0) returns the processes, the
    engine's ends of their pipes and their shared step counters; without (another node) they connect to the
    engine themselves, and only the processes are returned (with empty lists)."""
    context = _worker_context(spec.device_type)
    steps_taken = context.Array("q", len(ranks), lock=False) if with_pipes else None
    processes: list[BaseProcess] = []
    conns: list[Connection] = []
    for local_rank, rank in enumerate(ranks):
        child = None
        if with_pipes:
            parent, child = context.Pipe()
            conns.append(parent)
        process = context.Process(
            target=worker_main,
            args=(dataclasses.replace(spec, rank=rank, local_rank=local_rank), child, steps_taken),
            name=f"brisk-worker-{rank}",
            daemon=True,
        )
        with _allow_children():
            process.start()
        if child is not None:
            child.close()
        processes.append(process)
    return processes, conns, steps_taken


def _worker_context(device_type: str):
    """CUDA workers are spawned (CUDA cannot be forked). CPU workers fork from a forkserver that has imported the
    worker's modules once (seconds less per rank), and that never ran a torch op: a child forked from a process
    whose OpenMP thread pool ran hangs in its first parallel region."""
    if device_type == "cuda":
        return get_context("spawn")
    context = get_context("forkserver")
    context.set_forkserver_preload(["brisk.executor.worker_process", "transformers"])
    return context


def worker_timeout_s() -> float:
    return float(os.environ.get("BRISK_WORKER_TIMEOUT_S", DEFAULT_TIMEOUT_S))


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
        nnodes: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        timeout_s: float | None = None,
        use_ray: bool = False,
    ):
        """Starts this machine's ranks (all of them, or node 0's share of ``nnodes``) and waits for the others."""
        self.world_size = tensor_parallel_size * pipeline_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
        self._result_rank = (pipeline_parallel_size - 1) * tensor_parallel_size  # the last stage's first rank
        self.timeout_s = timeout_s or worker_timeout_s()
        self.failure: str | None = None
        self._encoder = StepEncoder(model_config.hf_config.vocab_size)
        self._inbox: list[deque] = [deque() for _ in range(self.world_size)]  # messages read ahead, per rank
        if master_port is None:
            master_port = _free_port() if nnodes == 1 else DEFAULT_MASTER_PORT
        spec = WorkerSpec(
            rank=0,
            local_rank=0,
            tp_size=tensor_parallel_size,
            pp_size=pipeline_parallel_size,
            init_method=f"tcp://{master_addr}:{master_port}",
            device_type=device.type,
            model_config=model_config,
            runner_args=runner_args,
            timeout_s=self.timeout_s,
        )
        local = local_ranks(self.world_size, nnodes, 0)
        accept_at = (master_addr, master_port + 1) if nnodes > 1 else None
        self._ray_ranks = ray_ranks = None
        if use_ray:  # every rank is a Ray actor, connecting back like another node's rank
            from brisk.executor.ray_ranks import RayRanks

            self._ray_ranks = ray_ranks = RayRanks(self.world_size, device.type, self.timeout_s)
            local, accept_at = range(0), (ray_ranks.driver_ip, _free_port())
        self._steps_sent = 0
        # Steps each rank has taken from its pipe (shared memory, read only on a timeout to name the rank that hangs).
        self._processes, self._conns, self._steps_taken = start_workers(spec, local, with_pipes=True)
        self._finalizer = weakref.finalize(self, _stop_workers, self._processes, self._conns, ray_ranks)
        if accept_at is not None:
            others = [rank for rank in range(self.world_size) if rank not in local]
            if ray_ranks is not None:
                ray_ranks.start(spec, accept_at)
            check = ray_ranks.check_started if ray_ranks is not None else None
            try:
                remote = accept_remote_workers(*accept_at, others, self.timeout_s, check)
            except (TimeoutError, RuntimeError) as exc:
                self._fail(str(exc))
            self._conns.extend(remote[rank] for rank in others)
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

    def init_step_buffers(
        self, max_num_batched_tokens: int, max_num_seqs: int, enforce_eager: bool, num_speculative_tokens: int = 0
    ) -> None:
        # Several ranks run eagerly: graphs would capture NCCL collectives and a stage's send/recv, which are not
        # verified on a multi-GPU machine yet.
        eager = enforce_eager or self.world_size > 1
        self._call("init_step_buffers", max_num_batched_tokens, max_num_seqs, eager, num_speculative_tokens)

    def weight_bytes(self) -> int:
        """The largest rank's parameter bytes."""
        return max(self._call("weight_bytes"))

    def reseed_sampler(self, seed: int) -> None:
        self._call("reseed_sampler", seed)

    def waits_at_launch(self, requests, speculative: bool) -> bool:
        """Never: a step goes to the workers down a pipe, and its result is read when the engine books it."""
        return False

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
                    if r >= len(self._processes):  # another node's rank: its connection is all there is
                        self._fail(f"worker rank {r} (on another node) disconnected during {what}")
                    continue  # the process is exiting: its sentinel names it
                if message[0] == "error":
                    dead = self._dead_peers(of=r)
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

    def _dead_peers(self, of: int, grace_s: float = 1.0) -> list[int]:
        """Local ranks other than ``of`` whose process died (a nonzero exit), waiting up to ``grace_s`` for one to.

        A peer killed mid-collective breaks the living rank's collective at once, so that rank's error can arrive
        before the killed process has been reaped; without the wait the report would blame the wrong rank. A peer
        that exits cleanly has reported its own error (every rank fails alike on a bad checkpoint), so it is not
        the cause.
        """
        deadline = time.monotonic() + grace_s
        pending = {process.sentinel: rank for rank, process in enumerate(self._processes) if rank != of}
        dead: list[int] = []
        while pending and not dead:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for sentinel in ready:
                rank = pending.pop(sentinel)
                self._processes[rank].join(0.5)  # the sentinel is ready before exitcode is set
                if self._processes[rank].exitcode not in (None, 0):
                    dead.append(rank)
        return dead

    def _timeout_message(self, rank: int, what: str) -> str:
        late = [r for r in range(len(self._processes)) if self._steps_taken[r] < self._steps_sent]
        if what == "a step" and late:
            ranks = ", ".join(map(str, late))
            return f"worker rank {ranks} did not take step {self._steps_sent} within {self.timeout_s:.0f} s (hung?)"
        return f"worker rank {rank} sent no result for {what} within {self.timeout_s:.0f} s (hung?)"

    def _exit_status(self, rank: int) -> str:
        if rank >= len(self._processes):
            return "on another node"
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
