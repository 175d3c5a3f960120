"""Executors run the model runner for the engine: in the engine's own process (one rank, no overhead: the
``ModelRunner`` itself) or as one worker process per rank (``MultiprocExecutor``). Both have the model runner's
interface, which is all the engine sees."""

from __future__ import annotations

import torch

from brisk.config import EngineArgs, ModelConfig
from brisk.distributed.parallel_config import check_device_count, check_parallel_shapes
from brisk.worker.model_runner import ModelRunner


def create_executor(args: EngineArgs, model_config: ModelConfig, device: torch.device, attention_backend: str):
    """Check that the model splits over the requested ranks and devices, then start the ranks."""
    check_parallel_shapes(model_config.hf_config, args.tensor_parallel_size, args.pipeline_parallel_size)
    device_count = torch.cuda.device_count() if device.type == "cuda" else 0
    check_device_count(args.world_size, device.type, device_count)
    runner_args = dict(
        block_size=args.block_size, attention_backend=attention_backend, load_format=args.load_format, seed=args.seed
    )
    backend = args.distributed_executor_backend or ("uni" if args.world_size == 1 else "mp")
    if backend == "uni":
        return ModelRunner(model_config, device, **runner_args)
    from brisk.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(model_config, device, args.tensor_parallel_size, args.pipeline_parallel_size, runner_args)
