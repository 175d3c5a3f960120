"""``brisk serve [MODEL]``: the OpenAI-compatible server. Engine flags use vLLM's names."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from brisk.entrypoints.cli.common import one_line_error, one_line_errors
from brisk.entrypoints.cli.engine_args import add_engine_arguments, engine_kwargs, parse_bytes, positive_int
from brisk.entrypoints.openai.config import DEFAULT_MAX_REQUEST_BODY_BYTES, ServerConfig

DEFAULTS = ServerConfig(served_model_names=[])

DEFAULT_MODEL = "smollm2-135m-instruct"


def _tool_parsers() -> list[str]:
    from brisk.entrypoints.openai.tool_parsers import TOOL_PARSERS

    return list(TOOL_PARSERS)


def _reasoning_parsers() -> list[str]:
    from brisk.entrypoints.openai.reasoning_parsers import REASONING_PARSERS

    return list(REASONING_PARSERS)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="Address to bind (default: 127.0.0.1, loopback only).")
    g.add_argument("--port", type=int, default=8000, help="Port (default: 8000; 0 picks a free one).")
    g.add_argument(
        "--api-key",
        default=None,
        help="Require 'Authorization: Bearer KEY' on every route but /health (default: $BRISK_API_KEY).",
    )
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="Name(s) clients use in 'model' (default: MODEL as given). The first is reported in responses.",
    )
    g.add_argument("--chat-template", default=None, help="A Jinja chat template, or a file holding one.")
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='Serve tool_choice "auto": find tool calls in the model\'s text with --tool-call-parser.',
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(_tool_parsers()),
        help="How the model writes tool calls (hermes: Qwen2.5 and Hermes; llama3_json; mistral).",
    )
    g.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(_reasoning_parsers()),
        help="Split <think> reasoning into reasoning_content (deepseek_r1, qwen3).",
    )
    g.add_argument(
        "--max-waiting-requests",
        type=int,
        default=1024,
        help="Requests allowed to wait for the engine before new ones get 503 (default: 1024; 0: no limit).",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="Seconds in-flight requests get to finish after SIGTERM (default: 30).",
    )
    g.add_argument(
        "--max-request-body-bytes",
        type=parse_bytes,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="Larger request bodies get 413 (default: 4MiB).",
    )
    g.add_argument("--max-n", type=positive_int, default=16, help="Largest 'n' accepted (default: 16).")
    g.add_argument(
        "--max-tokens-limit",
        type=positive_int,
        default=None,
        help="Largest max_tokens accepted, and the default cap (default: only max_model_len bounds it).",
    )
    g.add_argument(
        "--max-prompts-per-request",
        type=positive_int,
        default=DEFAULTS.max_prompts_per_request,
        help=f"Most prompts in one completions request (default: {DEFAULTS.max_prompts_per_request}).",
    )
    g.add_argument(
        "--limit-concurrency",
        type=int,
        default=DEFAULTS.limit_concurrency,
        help=f"Most open connections (default: {DEFAULTS.limit_concurrency}; 0: no limit). Beyond it a new "
        "connection replaces the one waiting longest for its request headers, or gets 503.",
    )
    # Timeouts in seconds: (flag, type, what it bounds; its default is ServerConfig's).
    timeouts = [
        ("--header-timeout", positive_float, "Seconds a connection has to send its request headers"),
        ("--body-timeout", positive_float, "Seconds a request has to send its body, after its headers"),
        (
            "--engine-stall-timeout",
            float,
            "Seconds the engine process may go without a heartbeat (it sends one a second, even in a long step) "
            "while requests wait on it, before /health answers 503 and new requests are refused",
        ),
        (
            "--engine-step-timeout",
            float,
            "Seconds the engine may go without completing a step while requests wait on it, before /health "
            "answers 503",
        ),
        ("--request-timeout", positive_float, "Seconds a request may take in all before it is ended with an error"),
    ]
    for flag, kind, what in timeouts:
        default = getattr(DEFAULTS, flag[2:].replace("-", "_"))
        shown = "no limit" if default is None else f"{default:g}" + ("; 0: never" if kind is float else "")
        g.add_argument(flag, type=kind, default=default, help=f"{what} (default: {shown}).")
    g.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level (default: info).",
    )
    g.add_argument("--disable-uvicorn-access-log", action="store_true", help="Do not log every HTTP request.")
    g.add_argument(
        "--enable-log-requests",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Log each request's id, prompt length and sampling parameters at INFO (default: off).",
    )
    g.add_argument(
        "--disable-log-stats",
        action="store_true",
        help="Accepted for vLLM's command lines: brisk logs no periodic statistics (they are on /metrics).",
    )


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {value!r}")
    return number


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="Serve a model with an OpenAI-compatible HTTP API.",
        description="Serve a model with an OpenAI-compatible HTTP API (completions, chat, streaming).",
    )
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help=f"Model: an HF folder, a .gguf file or an embedded name (default: {DEFAULT_MODEL}).",
    )
    parser.add_argument("--model", dest="model_flag", default=None, help="Same as MODEL (vLLM's spelling).")
    add_server_arguments(parser)
    add_engine_arguments(parser)
    one_line_errors(parser)
    parser.set_defaults(func=run)
    return parser


def read_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    if "{" not in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"--chat-template: no such file {value!r} (and not a Jinja template).")
        return path.read_text()
    return value


def serve_cpu_threads() -> int:
    """The engine's CPU threads when --threads is not given: a core for each but one, which the HTTP front end
    (tokenizing, detokenizing, streaming) keeps busy. OpenMP threads wait for each other at every parallel region,
    so an engine with a thread on the front end's core stalls whenever that core is taken: on 2 cores, 2 threads
    beside one busy process decode at 6.4 tok/s against 12.8 with 1 thread (docs/benchmarks.md)."""
    from brisk.config import usable_cores

    return max(1, usable_cores() - 1)


def build_configs(args: argparse.Namespace):
    from brisk.config import EngineArgs
    from brisk.entrypoints.openai.config import ServerConfig

    if args.model and args.model_flag and args.model != args.model_flag:
        raise ValueError(f"MODEL ({args.model!r}) and --model ({args.model_flag!r}) disagree; give one.")
    model = args.model or args.model_flag or DEFAULT_MODEL
    engine_args = EngineArgs(
        model=model, serving=True, **{"cpu_threads": serve_cpu_threads(), **engine_kwargs(args)}
    )
    engine_args.validate()

    api_key = args.api_key if args.api_key is not None else os.environ.get("BRISK_API_KEY") or None
    if args.max_waiting_requests < 0:
        raise ValueError("--max-waiting-requests must be >= 0 (0 means no limit).")
    if args.shutdown_timeout < 0:
        raise ValueError("--shutdown-timeout must be >= 0.")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}.")
    if args.limit_concurrency < 0:
        raise ValueError("--limit-concurrency must be >= 0 (0 means no limit).")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME (how the model writes calls).")
    for flag in ("engine_stall_timeout", "engine_step_timeout"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0 (0 means never).")
    server_config = ServerConfig(
        served_model_names=list(args.served_model_name or [model]),
        host=args.host,
        port=args.port,
        api_key=api_key,
        chat_template=read_chat_template(args.chat_template),
        max_n=args.max_n,
        max_tokens_limit=args.max_tokens_limit,
        max_request_body_bytes=args.max_request_body_bytes,
        max_waiting_requests=args.max_waiting_requests or None,
        shutdown_timeout=args.shutdown_timeout,
        max_prompts_per_request=args.max_prompts_per_request,
        limit_concurrency=args.limit_concurrency or None,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        engine_stall_timeout=args.engine_stall_timeout or None,
        engine_step_timeout=args.engine_step_timeout or None,
        request_timeout=args.request_timeout,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        enable_log_requests=args.enable_log_requests,
    )
    return engine_args, server_config


def run(args: argparse.Namespace) -> int:
    from brisk.entrypoints.openai.server import run_server

    engine_args, server_config = build_configs(args)
    if engine_args.node_rank > 0:  # another machine's ranks: no server here
        from brisk.executor.worker_node import run_worker_node

        return run_worker_node(engine_args)
    try:
        return run_server(
            engine_args,
            server_config,
            uvicorn_log_level=args.uvicorn_log_level,
            access_log=not args.disable_uvicorn_access_log,
        )
    except FileNotFoundError as exc:  # an unknown model: the reason and the known names, on one line
        raise FileNotFoundError(one_line_error(str(exc))) from None
