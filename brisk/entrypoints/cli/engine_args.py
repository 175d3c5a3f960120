"""The engine flags ``brisk serve`` and ``brisk bench`` share, under vLLM's names, and their conversion into
``EngineArgs`` keyword arguments.

Every flag defaults to ``None`` and only the flags given on the command line are passed on, so the engine's own
defaults (``EngineArgs``) apply otherwise; the defaults named in the help are those."""

from __future__ import annotations

import argparse
import json
import re

PARALLEL_FLAGS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "distributed_executor_backend",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
)

# The EngineArgs fields these flags set, in the order they are passed on.
ENGINE_FLAGS = (
    "tokenizer",
    "revision",
    "download_dir",
    "trust_remote_code",
    "generation_config",
    "dtype",
    "device",
    "max_model_len",
    "block_size",
    "enable_prefix_caching",
    "max_num_batched_tokens",
    "max_num_seqs",
    "cpu_threads",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "seed",
    "load_format",
    "enforce_eager",
    "attention_backend",
    "async_scheduling",
    "speculative_config",
    "quantization",
    "kv_cache_dtype",
    *PARALLEL_FLAGS,
)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``123``, ``512M``, ``4GiB``, ``1.5g``: binary multiples (K = 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a byte count like 4294967296, 512M or 4GiB, got {text!r}")
    number, unit, _ = match.groups()
    scale = 1024 ** "_kmgt".index(unit.lower() or "_")
    return int(float(number) * scale)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def json_object(text: str) -> dict:
    """A JSON object on the command line, e.g. ``{"method": "ngram", "num_speculative_tokens": 4}``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_speculative_arguments(group) -> None:
    """``--speculative-config`` and ``--speculative-disable-by-batch-size`` (vLLM's flags)."""
    group.add_argument(
        "--speculative-config",
        type=json_object,
        default=None,
        help='Speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
        "(see docs/speculative-decoding.md; default: off).",
    )
    group.add_argument(
        "--speculative-disable-by-batch-size",
        type=positive_int,
        default=None,
        help="Propose no drafts while this many requests or more are running (sets the speculative "
        "config's disable_by_batch_size; default 2, measured: docs/speculative-decoding.md).",
    )


def speculative_config(args: argparse.Namespace) -> dict | None:
    """``--speculative-config`` with ``--speculative-disable-by-batch-size`` folded in (the flag wins)."""
    config = getattr(args, "speculative_config", None)
    disable = getattr(args, "speculative_disable_by_batch_size", None)
    if disable is None:
        return config
    if config is None:
        raise ValueError("--speculative-disable-by-batch-size needs --speculative-config.")
    return {**config, "disable_by_batch_size": disable}


def add_engine_arguments(parser: argparse.ArgumentParser, title: str = "engine") -> None:
    """The flags of ``ENGINE_FLAGS``, in an argument group called ``title``; each defaults to ``None`` (not given)."""
    g = parser.add_argument_group(title)
    g.add_argument("--tokenizer", default=None, help="Tokenizer folder or name (default: the model's).")
    g.add_argument("--revision", default=None, help="Hub ids: the branch, tag or commit (default: main).")
    g.add_argument("--download-dir", default=None, help="Hub ids: download here (default: the Hugging Face cache).")
    g.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=None,
        help="Run the config and tokenizer classes the model folder ships (auto_map) through transformers.",
    )
    g.add_argument(
        "--generation-config",
        default=None,
        help="Sampling defaults of requests that leave them out: auto (the model's generation_config.json), "
        "vllm (neutral) or a folder holding a generation_config.json (default: auto).",
    )
    g.add_argument("--dtype", default=None, help="auto, float32, float16 or bfloat16 (default: auto).")
    g.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N (default: auto).")
    g.add_argument("--max-model-len", type=positive_int, default=None, help="Context length (prompt + output).")
    g.add_argument("--block-size", type=int, default=None, help="Tokens per KV-cache block (default: 16).")
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Reuse KV-cache blocks of shared prompt prefixes (default: on).",
    )
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=None, help="Token budget per step.")
    g.add_argument("--max-num-seqs", type=positive_int, default=None, help="Sequences per step (default: 256).")
    g.add_argument(
        "--threads",
        dest="cpu_threads",
        type=positive_int,
        default=None,
        help="CPU: torch threads of the engine, split over its ranks (default: one a core; brisk serve: one a "
        "core but one, which the HTTP front end uses).",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="Fraction of GPU memory to use (GPU only; default: 0.9).",
    )
    g.add_argument(
        "--kv-cache-memory-bytes",
        type=parse_bytes,
        default=None,
        help="KV-cache size, e.g. 2GiB, instead of --gpu-memory-utilization (default on the CPU: 2GiB).",
    )
    g.add_argument("--seed", type=int, default=None, help="Engine random seed (default: 0).")
    g.add_argument("--load-format", default=None, help="auto, safetensors or dummy (random weights; default: auto).")
    g.add_argument("--enforce-eager", action="store_true", default=None, help="Never capture CUDA graphs.")
    g.add_argument(
        "--attention-backend",
        default=None,
        help="torch, triton or flashinfer (optional package; default: triton on CUDA, torch on CPU).",
    )
    g.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Schedule and launch step N+1 while step N runs on the device (default: on for CUDA, off on CPU).",
    )
    add_speculative_arguments(g)
    g.add_argument(
        "--quantization",
        "-q",
        default=None,
        help="fp8 (quantize the weights while loading) or the checkpoint's own format, e.g. compressed-tensors "
        "(default: the checkpoint's quantization_config, if any).",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default=None,
        help="auto (the model's dtype) or fp8 / fp8_e4m3 (float8_e4m3fn with per-layer scales; default: auto).",
    )
    add_parallel_arguments(g)


def add_parallel_arguments(group) -> None:
    """``-tp``, ``-pp`` and the executor backend (vLLM's names), each defaulting to ``None`` (not given)."""
    group.add_argument(
        "--tensor-parallel-size", "-tp", type=positive_int, default=None, help="Tensor-parallel ranks (default: 1)."
    )
    group.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=positive_int,
        default=None,
        help="Pipeline stages, each owning contiguous layers (default: 1).",
    )
    group.add_argument(
        "--distributed-executor-backend",
        choices=("uni", "mp", "ray"),
        default=None,
        help="uni: one rank in the engine's process; mp: one worker process per rank; ray: one Ray actor per rank "
        "on the Ray cluster (default: uni for one rank, mp for more).",
    )
    group.add_argument("--nnodes", type=positive_int, default=None, help="Machines the ranks span (default: 1).")
    group.add_argument(
        "--node-rank",
        type=int,
        default=None,
        help="This machine's index: 0 runs the engine (and serves), the others only their ranks (default: 0).",
    )
    group.add_argument("--master-addr", default=None, help="Node 0's address (default: 127.0.0.1).")
    group.add_argument(
        "--master-port",
        type=positive_int,
        default=None,
        help="Node 0's port for torch.distributed; the next port carries the engine's commands (default: 29500 "
        "with --nnodes > 1).",
    )


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineArgs fields given on the command line (flags left at ``None`` are left out)."""
    kwargs = {name: getattr(args, name) for name in ENGINE_FLAGS if getattr(args, name, None) is not None}
    if speculative_config(args) is not None:
        kwargs["speculative_config"] = speculative_config(args)
    return kwargs
