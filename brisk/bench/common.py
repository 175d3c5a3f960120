"""What the offline benchmarks share: engine flags, the model argument, and running each backend in a process
of its own when several are compared (so one engine's GPU memory never squeezes the next)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from brisk.bench import configs

# Flags passed to EngineArgs only when given, so the engine's own defaults apply otherwise.
ENGINE_FLAGS = (
    "tokenizer",
    "dtype",
    "device",
    "max_model_len",
    "block_size",
    "enable_prefix_caching",
    "max_num_batched_tokens",
    "max_num_seqs",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "seed",
    "load_format",
    "enforce_eager",
    "attention_backend",
)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``123``, ``512M``, ``4GiB``: binary multiples."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a byte count like 4294967296, 512M or 4GiB, got {text!r}")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** "_kmgt".index(unit.lower() or "_"))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help=f"An HF folder, a known model name, or a shape written as a config-only folder: "
        f"{', '.join(configs.NAMED_CONFIGS)} (these default to --load-format dummy and --max-model-len "
        f"{configs.NAMED_DEFAULT_MAX_MODEL_LEN}).",
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine (passed to brisk.LLM only when given)")
    g.add_argument("--load-format", default=None, help="auto, safetensors or dummy (random weights).")
    g.add_argument("--tokenizer", default=None, help="Tokenizer folder (the workloads send token ids).")
    g.add_argument("--dtype", default=None, help="auto, float32, float16 or bfloat16.")
    g.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N.")
    g.add_argument("--max-model-len", type=positive_int, default=None)
    g.add_argument("--block-size", type=int, default=None)
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=None)
    g.add_argument("--max-num-seqs", type=positive_int, default=None)
    g.add_argument("--gpu-memory-utilization", type=float, default=None)
    g.add_argument("--kv-cache-memory-bytes", type=parse_bytes, default=None, help="e.g. 4GiB.")
    g.add_argument("--seed", type=int, default=None, help="Engine seed (default: the engine's, 0).")
    g.add_argument("--enforce-eager", action="store_true", default=None, help="Never capture CUDA graphs.")
    g.add_argument("--attention-backend", default=None, help="torch or triton (default: per device).")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineArgs fields given on the command line, plus the named shapes' defaults."""
    from brisk.config import EngineArgs

    known = set(EngineArgs.__dataclass_fields__)
    kwargs = {}
    for name in ENGINE_FLAGS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name not in known:
            raise ValueError(f"--{name.replace('_', '-')} is not an engine argument of this brisk version.")
        kwargs[name] = value
    if configs.is_named(args.model):
        if kwargs.setdefault("load_format", "dummy") != "dummy":
            raise ValueError(f"{args.model} is a config-only shape: it has no weights, use --load-format dummy.")
        kwargs.setdefault("max_model_len", configs.NAMED_DEFAULT_MAX_MODEL_LEN)
    return kwargs


def backends_of(args: argparse.Namespace) -> list[str]:
    return ["brisk", "hf"] if args.backend == "both" else [args.backend]


_CHILD = (
    "import importlib, json, sys, argparse\n"
    "module, fn, args_path, out_path, backend = sys.argv[1:6]\n"
    "args = argparse.Namespace(**json.load(open(args_path)))\n"
    "result = getattr(importlib.import_module(module), fn)(args, backend)\n"
    "json.dump(result, open(out_path, 'w'))\n"
)


def run_backends(args: argparse.Namespace, module: str, fn: str) -> dict[str, dict]:
    """``{backend: fn(args, backend)}``: in this process for one backend, else one child process per backend."""
    backends = backends_of(args)
    func: Callable = getattr(sys.modules[module], fn)
    if len(backends) == 1:
        return {backends[0]: func(args, backends[0])}
    repo_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH")) if p)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="brisk-bench-") as tmp:
        args_path = Path(tmp) / "args.json"
        args_path.write_text(json.dumps({k: v for k, v in vars(args).items() if k != "func"}))
        for backend in backends:
            out_path = Path(tmp) / f"{backend}.json"
            print(f"== {backend}: running in a child process", flush=True)
            cmd = [sys.executable, "-c", _CHILD, module, fn, str(args_path), str(out_path), backend]
            proc = subprocess.run(cmd, env=env)
            if proc.returncode != 0 or not out_path.is_file():
                results[backend] = {"backend": backend, "error": f"child process exited with {proc.returncode}"}
            else:
                results[backend] = json.loads(out_path.read_text())
    return results
