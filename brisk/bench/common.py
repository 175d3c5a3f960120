"""What the offline benchmarks share: engine flags, the model argument, the backends, and running each backend in a
process of its own when several are compared (so one engine's GPU memory never squeezes the next)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from brisk.bench import configs, report
from brisk.entrypoints.cli import engine_args as shared_engine_args


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help=f"An HF folder, a known model name, or a shape written as a config-only folder: "
        f"{', '.join(configs.NAMED_CONFIGS)} (these default to --load-format dummy and --max-model-len "
        f"{configs.NAMED_DEFAULT_MAX_MODEL_LEN}).",
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    shared_engine_args.add_engine_arguments(parser, title="engine (passed to brisk.LLM only when given)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineArgs fields given on the command line, plus the named shapes' defaults."""
    kwargs = shared_engine_args.engine_kwargs(args)
    if configs.is_named(args.model):
        if kwargs.setdefault("load_format", "dummy") != "dummy":
            raise ValueError(f"{args.model} is a config-only shape: it has no weights, use --load-format dummy.")
        kwargs.setdefault("max_model_len", configs.NAMED_DEFAULT_MAX_MODEL_LEN)
    return kwargs


def flags_not_applied(args: argparse.Namespace, backend: str) -> list[str]:
    """The engine flags given on the command line that ``backend`` (a peer) has no counterpart for."""
    from brisk.bench.backends import PEER_ENGINE_FLAGS

    applied = PEER_ENGINE_FLAGS[backend]
    given = shared_engine_args.engine_kwargs(args)
    return [f"--{name.replace('_', '-')}" for name in given if applied is not None and name not in applied]


def check_engine_flags(args: argparse.Namespace) -> None:
    """Before anything runs: the engine flags make valid ``EngineArgs``, and a peer run alone is given none that
    only brisk's engine takes (beside brisk they go to brisk, and the peer's result lists them)."""
    from brisk.config import EngineArgs

    EngineArgs(model=args.model, **engine_kwargs(args)).validate()
    backends = backends_of(args)
    if "brisk" in backends:
        return
    for backend in backends:
        flags = flags_not_applied(args, backend)
        if flags:
            raise ValueError(
                f"--backend {backend} does not take {', '.join(flags)}: they set brisk's engine. Drop them, or "
                f"add brisk (--backend brisk,{backend}) to give them to brisk."
            )


@contextlib.contextmanager
def open_backend(args: argparse.Namespace, backend_name: str, hf_batch_size: int) -> Iterator:
    """The backend on ``args.model`` with the command line's engine flags; closed when the block ends normally
    (a named shape's temporary folder is removed however it ends)."""
    from brisk.bench.backends import make_backend

    with configs.materialize(args.model) as model:
        not_applied = flags_not_applied(args, backend_name)
        backend = make_backend(backend_name, model, engine_kwargs(args), hf_batch_size, not_applied)
        yield backend
        backend.close()


def backend_fields(backend, warmup_s: float) -> dict:
    """What closes every backend's result: the warm-up time, the engine as described, the device's name."""
    engine = backend.describe()
    return {"warmup_s": round(warmup_s, 3), "engine": engine, "device_name": report.device_name(engine.get("device"))}


def finish(bench: str, args: argparse.Namespace, config: dict, results: dict, print_table: Callable, **extra) -> int:
    """The report (device: the first backend's), printed with ``print_table`` and written to --output-json; the exit
    status, 1 when a backend failed."""
    env = report.environment()
    env["device_name"] = next((r["device_name"] for r in results.values() if "error" not in r), None)
    data = report.make_report(bench, args, config, results, env, **extra)
    print_table(data)
    report.write_json(data, args.output_json)
    return 0 if all("error" not in r for r in results.values()) else 1


BACKENDS = ("brisk", "hf", "vllm")


def parse_backends(text: str) -> list[str]:
    """``--backend``: one of :data:`BACKENDS`, several joined by commas (``brisk,vllm``), or ``both`` (brisk,hf)."""
    names = ["brisk", "hf"] if text == "both" else [name.strip().lower() for name in text.split(",")]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(BACKENDS)}, several joined by commas (brisk,vllm), or both; got {text!r}"
        )
    return names


def backends_of(args: argparse.Namespace) -> list[str]:
    backend = getattr(args, "backend", "brisk")  # benchmarks without --backend run brisk alone
    return list(backend) if isinstance(backend, list) else parse_backends(backend)


# A backend's run in a child process; an error that says what to change becomes the backend's result.
_CHILD = """
import argparse, importlib, json, sys
module, fn, args_path, out_path, backend = sys.argv[1:6]
args = argparse.Namespace(**json.load(open(args_path)))
try:
    result = getattr(importlib.import_module(module), fn)(args, backend)
except (ValueError, FileNotFoundError, RuntimeError) as exc:
    result = {"backend": backend, "error": str(exc)}
json.dump(result, open(out_path, "w"))
"""


def run_backends(args: argparse.Namespace, module: str, fn: str) -> dict[str, dict]:
    """``{backend: fn(args, backend)}``: in this process for one backend, else one child process per backend."""
    check_engine_flags(args)
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
