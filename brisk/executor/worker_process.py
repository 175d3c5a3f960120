"""The main function of one worker process of a multi-process engine: join the process groups, load this
rank's shard of the model, then serve the driver's commands (method calls and steps) over a pipe.

Every rank runs every step (tensor-parallel layers meet in collectives; pipeline stages pass activations on).
The last stage's ranks sample from the same gathered logits with the same seeds, and so hold the same sampled ids
for the next step's inputs; only its rank 0 sends results. After launching a step that rank waits for whichever
comes first, the step's tokens or the driver's next command: a command that comes first is launched behind the
running step (async scheduling), so the device does not idle between steps while tokens cross the pipe."""

from __future__ import annotations

import dataclasses
import os
import pickle
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

import torch

from brisk.config import ModelConfig
from brisk.distributed.parallel_state import (
    get_pp_rank,
    get_tp_rank,
    init_pipeline_parallel,
    init_tensor_parallel,
    is_last_stage,
    stage_layers,
)
from brisk.executor.nodes import connect_to_driver
from brisk.executor.step_sync import RequestMirror
from brisk.step_timer import StepTimer
from brisk.worker.model_runner import LaunchedStep, ModelRunner


def rank_model_config(model_config: ModelConfig, tp_size: int, pp_rank: int = 0, pp_size: int = 1) -> ModelConfig:
    """The model as one rank sees it: its share of the KV heads (at least one: fewer heads are replicated) and its
    stage's layers (their KV cache is all it holds)."""
    return dataclasses.replace(
        model_config,
        num_kv_heads=max(1, model_config.num_kv_heads // tp_size),
        num_layers=len(stage_layers(model_config.num_layers, pp_rank, pp_size)),
    )


def _init_groups(rank: int, tp_size: int, pp_size: int) -> None:
    """Rank ``pp_rank * tp_size + tp_rank``: one tensor-parallel group per stage, and the same tensor-parallel index
    of the stages before and after it for the activations. Every rank creates every group (torch's rule)."""
    pp_rank, tp_rank = divmod(rank, tp_size)
    group = None
    if pp_size > 1:
        for stage in range(pp_size):
            created = torch.distributed.new_group(list(range(stage * tp_size, (stage + 1) * tp_size)))
            if stage == pp_rank:
                group = created
    init_tensor_parallel(tp_rank, tp_size, group)
    prev_rank = rank - tp_size if pp_rank > 0 else None
    next_rank = rank + tp_size if pp_rank < pp_size - 1 else None
    init_pipeline_parallel(pp_rank, pp_size, prev_rank, next_rank)


@dataclass
class WorkerSpec:
    """What one worker process needs to become its rank (picklable: CUDA workers are spawned)."""

    rank: int
    local_rank: int  # index among this machine's ranks: its GPU
    tp_size: int
    pp_size: int
    init_method: str  # torch.distributed rendezvous, tcp://host:port
    device_type: str
    model_config: ModelConfig
    runner_args: dict
    timeout_s: float
    driver_address: tuple[str, int] | None = None  # another node's rank: connect here instead of using a pipe
    watch_parent: bool = True  # exit when the parent process goes (not for Ray actors, whose parent is Ray's)


def worker_main(spec: WorkerSpec, conn: Connection | None, steps_taken) -> None:
    """``conn``: this rank's pipe to the engine (None on another node: it connects to ``spec.driver_address``);
    ``steps_taken``: shared step counters of this node's ranks (None on another node)."""
    rank, tp_size, pp_size = spec.rank, spec.tp_size, spec.pp_size
    parent_pid = os.getppid() if spec.watch_parent else None
    if conn is None:
        conn = connect_to_driver(*spec.driver_address, rank, spec.timeout_s)
    try:
        if spec.device_type == "cuda":
            device = torch.device("cuda", spec.local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")  # its threads: runner_args' cpu_threads
        torch.distributed.init_process_group(
            "nccl" if spec.device_type == "cuda" else "gloo",
            init_method=spec.init_method,
            rank=rank,
            world_size=tp_size * pp_size,
            timeout=timedelta(seconds=spec.timeout_s),
        )
        _init_groups(rank, tp_size, pp_size)
        config = rank_model_config(spec.model_config, tp_size, get_pp_rank(), pp_size)
        runner = ModelRunner(config, device, **spec.runner_args)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    try:
        _serve(runner, conn, rank, device, parent_pid, steps_taken)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the driver is gone
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _wait_for_command(conn: Connection, parent_pid: int | None) -> None:
    """Block until the driver sends something; exit when this process's parent is gone (the driver, or the
    forkserver that exits with it: a sibling may hold a copy of the driver's end of this pipe, so its end of file
    cannot be relied on)."""
    while not conn.poll(1.0):
        if parent_pid is not None and os.getppid() != parent_pid:
            raise EOFError("the driver process is gone")


def _command_before_tokens(conn: Connection, pending: LaunchedStep) -> bool:
    """Poll until the driver's next command is queued (True) or ``pending``'s tokens are ready (False). It spins:
    a sleep between polls would add its length to every step's latency."""
    while True:
        if conn.poll(0):
            return True
        if pending.is_ready():
            return False


def _serve(
    runner: ModelRunner, conn: Connection, rank: int, device: torch.device, parent_pid: int | None, steps_taken
) -> None:
    """``steps_taken[rank]`` counts the steps read from the pipe (the driver reads it to name a rank that hangs).
    Rank 0 of the last stage reports each step's sampled tokens."""
    reports = is_last_stage() and get_tp_rank() == 0
    mirror = RequestMirror(samples=is_last_stage())
    timer = StepTimer(device, enabled=False)
    pending: LaunchedStep | None = None  # rank 0: a launched step whose tokens are not sent yet
    while True:
        if pending is not None and not _command_before_tokens(conn, pending):
            conn.send(("step", pending.result()))
            pending = None
        _wait_for_command(conn, parent_pid)
        kind, payload = pickle.loads(conn.recv_bytes())
        try:
            if kind == "shutdown":
                return
            if kind == "step":
                if steps_taken is not None:
                    steps_taken[rank] += 1
                launched = runner.execute(mirror.apply(payload), timer)
                if pending is not None:
                    conn.send(("step", pending.result()))
                pending = launched if reports else None
            else:  # "call": (method name, args)
                method, args = payload
                conn.send(("ok", getattr(runner, method)(*args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))
            return
