"""A machine other than node 0 (``--node-rank N``, N > 0): start this node's ranks, which connect to the engine on
node 0, and wait until they end (when the engine stops, or fails)."""

from __future__ import annotations

import logging

from brisk.config import EngineArgs, ModelConfig, preferred_dtype, read_hf_config, resolve_device, resolve_dtype
from brisk.executor import check_parallel_layout, runner_args
from brisk.executor.multiproc import start_workers, worker_timeout_s
from brisk.executor.nodes import DEFAULT_MASTER_PORT, local_ranks
from brisk.executor.worker_process import WorkerSpec
from brisk.layers.attention import default_backend
from brisk.loader.resolve import resolve_model

logger = logging.getLogger(__name__)


def run_worker_node(args: EngineArgs) -> int:
    """Returns 0 when every rank ended cleanly, else 1 (a rank's error is on stderr)."""
    args.validate()
    device = resolve_device(args.device)
    path = resolve_model(str(args.model), preferred_dtype(args.dtype, device))
    hf_config = read_hf_config(path, args.trust_remote_code)
    model_config = ModelConfig.from_hf_config(
        path, hf_config, resolve_dtype(args.dtype, hf_config, device), args.max_model_len
    )
    check_parallel_layout(args, model_config, device)
    port = args.master_port or DEFAULT_MASTER_PORT
    spec = WorkerSpec(
        rank=0,
        local_rank=0,
        tp_size=args.tensor_parallel_size,
        pp_size=args.pipeline_parallel_size,
        init_method=f"tcp://{args.master_addr}:{port}",
        device_type=device.type,
        model_config=model_config,
        runner_args=runner_args(args, args.attention_backend or default_backend(device)),
        timeout_s=worker_timeout_s(),
        driver_address=(args.master_addr, port + 1),
    )
    ranks = local_ranks(args.world_size, args.nnodes, args.node_rank)
    processes, _, _ = start_workers(spec, ranks, with_pipes=False)
    logger.info(
        "node %d: ranks %d-%d started, engine at %s:%d", args.node_rank, ranks[0], ranks[-1], args.master_addr, port
    )
    for process in processes:
        process.join()
    return 0 if all(process.exitcode == 0 for process in processes) else 1
