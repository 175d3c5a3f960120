"""``brisk generate PROMPT``: one completion, streamed to stdout as it is generated, with a stats line on stderr.

The prompt goes through the model's chat template as a user message (``--system`` adds a system message);
``--raw`` completes it as-is. ``-`` (or no prompt with a pipe on stdin) reads the prompt from stdin. ``--json``
prints one JSON object instead (text, token ids, finish reason, usage, timings)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from brisk.entrypoints.cli import common


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "generate",
        help="Generate one completion for a prompt, streamed to stdout.",
        description="Generate one completion for a prompt, streamed to stdout as it is produced; a stats line "
        "(tokens, tok/s, time to first token) goes to stderr.",
    )
    parser.add_argument(
        "prompt",
        nargs="?",
        default=None,
        help="The prompt; '-' reads it from stdin (as does leaving it out when stdin is a pipe).",
    )
    parser.add_argument("--raw", action="store_true", help="Complete the prompt as-is, without the chat template.")
    parser.add_argument(
        "--json",
        action="store_true",
        help="Print one JSON object (text, token_ids, finish_reason, usage, timings) instead of streaming text.",
    )
    common.add_model_and_sampling_arguments(parser)
    common.add_engine_arguments(parser)
    common.one_line_errors(parser)
    parser.set_defaults(func=run)
    return parser


def read_prompt(prompt: str | None) -> str:
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise ValueError("no prompt: give PROMPT, or '-' to read it from stdin.")
        prompt = "-"
    if prompt == "-":
        prompt = sys.stdin.read()
        if prompt.endswith("\n"):
            prompt = prompt[:-1]
    if not prompt.strip():
        raise ValueError("the prompt is empty.")
    return prompt


def run(args: argparse.Namespace) -> int:
    common.sampling_params_from_args(args)  # every flag is checked before anything loads
    engine_args = common.engine_args_from_args(args)
    if engine_args.node_rank > 0:  # another machine's ranks: the prompt is node 0's
        from brisk.executor.worker_node import run_worker_node

        return run_worker_node(engine_args)
    if args.raw and args.system is not None:
        raise ValueError("--system needs the chat template: it cannot be combined with --raw.")
    prompt = read_prompt(args.prompt)
    common.quiet_startup(args.verbose)

    load_start = time.perf_counter()
    engine = common.build_engine(engine_args)
    params = common.sampling_params_from_args(args, engine.default_sampling_fields)  # the model's defaults
    load_s = time.perf_counter() - load_start

    if args.raw:
        request_prompt = prompt
    else:
        messages = [{"role": "system", "content": args.system}] if args.system is not None else []
        messages.append({"role": "user", "content": prompt})
        request_prompt = common.chat_prompt_ids(engine, messages)

    on_delta = None if args.json else common.write_stdout
    try:
        result = common.stream(engine, request_prompt, params, on_delta)
        if args.json:
            common.write_stdout(json.dumps(_as_json(args, prompt, result, load_s), ensure_ascii=False) + "\n")
        else:
            common.write_stdout("\n")
    except BrokenPipeError:
        common.silence_broken_stdout()
        return 1
    if not args.json:
        print(result.stats_line(), file=sys.stderr, flush=True)
    return 0


def _as_json(args: argparse.Namespace, prompt: str, result: common.StreamResult, load_s: float) -> dict:
    def rounded(x: float | None, digits: int = 4) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "model": args.model,
        "prompt": prompt,
        "raw": bool(args.raw),
        "text": result.text,
        "token_ids": result.token_ids,
        "finish_reason": result.finish_reason,
        "stop_reason": result.stop_reason,
        "usage": {
            "prompt_tokens": len(result.prompt_token_ids),
            "completion_tokens": result.num_tokens,
            "total_tokens": len(result.prompt_token_ids) + result.num_tokens,
        },
        "timings": {
            "load_s": rounded(load_s),
            "time_to_first_token_s": rounded(result.time_to_first_token_s),
            "total_s": rounded(result.total_s),
            "tokens_per_s": rounded(result.tokens_per_s, 2),
            "decode_tokens_per_s": rounded(result.decode_tokens_per_s, 2),
        },
    }
