"""``brisk bench {throughput,latency,long-context,startup,serve,write-config}``: the workloads of BENCHMARKS.md.

Each sub-command prints a short table and, with ``--output-json``, writes every number with the command line,
date, device and brisk commit. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse


def _throughput(args: argparse.Namespace) -> int:
    from brisk.bench.throughput import run

    return run(args)


def _latency(args: argparse.Namespace) -> int:
    from brisk.bench.latency import run

    return run(args)


def _long_context(args: argparse.Namespace) -> int:
    from brisk.bench.long_context import run

    return run(args)


def _startup(args: argparse.Namespace) -> int:
    from brisk.bench.startup import run

    return run(args)


def _serve(args: argparse.Namespace) -> int:
    from brisk.bench.serve import run

    return run(args)


def _write_config(args: argparse.Namespace) -> int:
    from brisk.bench.configs import write_config_folder

    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    folder = write_config_folder(args.out, args.name, tokenizer=args.tokenizer, **overrides)
    print(folder)
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-json", default=None, help="Write every number (and the setup) to this file.")


def _add_model_and_engine(parser: argparse.ArgumentParser) -> None:
    """--model, --output-json and the engine flags: what every in-process benchmark takes."""
    from brisk.bench.common import add_engine_arguments, add_model_arguments

    add_model_arguments(parser)
    _add_common(parser)
    add_engine_arguments(parser)


def _add_offline(parser: argparse.ArgumentParser, batch_help: str) -> None:
    from brisk.bench.common import parse_backends

    parser.add_argument(
        "--backend",
        type=parse_backends,
        default="brisk",
        help="brisk, hf (transformers generate), vllm (an installed vLLM), several joined by commas (brisk,vllm), "
        "or both (brisk,hf); several run one after another, each in its own process, and print brisk's ratios.",
    )
    parser.add_argument(
        "--peer-json",
        default=None,
        help='vLLM\'s figures from another run, as JSON {"W1": {"output_tok_s": N}, "W2": ..., "W3": '
        '{"decode_tok_s_median": N}}: print them and brisk\'s ratio.',
    )
    _add_model_and_engine(parser)
    if batch_help:
        parser.add_argument("--hf-batch-size", type=int, default=None, help=batch_help)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from brisk.bench import configs

    parser = subparsers.add_parser(
        "bench",
        help="Benchmark brisk (offline throughput, latency, startup) or any OpenAI-compatible server.",
        description="Benchmark workloads W1-W7 (BENCHMARKS.md); see docs/benchmarks.md.",
    )
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")

    p = sub.add_parser(
        "throughput",
        help="W1/W2 offline throughput: one generate call over all requests.",
        description="W1 (256 requests, input/output uniform [100, 1024], T=0.6) or W2 (256 x 512 in, 128 out, "
        "greedy), built exactly as the peers recipe (fingerprint-checked), after the recipe's warm-up.",
    )
    p.add_argument("--workload", type=str.upper, choices=["W1", "W2"], default="W1")
    p.add_argument("--num-prompts", type=int, default=None, help="Use the first N requests (default: all 256).")
    p.add_argument("--input-len", type=int, default=None, help="W2 only: prompt length (default 512).")
    p.add_argument("--output-len", type=int, default=None, help="Fixed output length for every request.")
    _add_offline(p, "HF backend: requests per static batch (default: 128).")
    p.set_defaults(func=_throughput)

    p = sub.add_parser(
        "latency",
        help="W3: one request (or a fixed batch) at a time; decode tok/s and ms per token.",
        description="W3: 3 runs of 128 prompt + 256 output tokens, greedy, fresh prompts (seed 2); then 3 runs of "
        "max_tokens=1 as a TTFT proxy. decode tok/s = batch * output / median wall.",
    )
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1, help="Requests per run (default 1).")
    p.add_argument("--num-iters", type=int, default=3, help="Runs of each kind (default 3).")
    _add_offline(p, "")
    p.set_defaults(func=_latency)

    p = sub.add_parser(
        "long-context",
        help="W4: a long prompt prefilled, then decoded on a prefix-cache hit; prefill and decode tok/s.",
        description="W4: per batch size (1, then 8), 32,000-token prompts (seed 3) prefilled by a one-token request "
        "with another last id, then 256 greedy tokens on the prompts themselves (a prefix-cache hit), as the "
        "peers recipe. --max-model-len defaults to input + output.",
    )
    p.add_argument("--input-len", type=int, default=32000, help="Prompt length (default 32000).")
    p.add_argument("--output-len", type=int, default=256, help="Tokens decoded on the cached prompt (default 256).")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="Requests per run (default 1 8).")
    p.add_argument(
        "--peer-json",
        default=None,
        help='vLLM\'s W4 figures from another run, as JSON {"W4": {...}} (docs/benchmarks.md): ratios to them.',
    )
    _add_model_and_engine(p)
    p.set_defaults(func=_long_context)

    p = sub.add_parser(
        "startup",
        help="W7: seconds from engine construction to the first generated token (fresh process).",
    )
    p.add_argument("--repeats", type=int, default=1, help="Fresh processes to time (default 1).")
    p.add_argument("--prompt-len", type=int, default=16, help="Prompt of the first request (default 16).")
    _add_model_and_engine(p)
    p.set_defaults(func=_startup)

    from brisk.bench.serve import DEFAULT_METRIC_PERCENTILES, DEFAULT_REFUSED_TIMEOUT

    p = sub.add_parser(
        "serve",
        help="W5/W6: stream completions from an OpenAI-compatible server; TTFT, TPOT, ITL, E2EL as vLLM.",
        description="An async client for /v1/completions with stream, ignore_eos and fixed max_tokens, on vLLM's "
        "random dataset idea. Metrics follow vLLM bench serve.",
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="Server root (default http://127.0.0.1:8000).")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None, help="Served model name (default: the first of /v1/models).")
    p.add_argument("--api-key", default=None, help="Bearer key (default: $OPENAI_API_KEY).")
    p.add_argument("--dataset", "--dataset-name", dest="dataset", choices=["random"], default="random")
    p.add_argument("--tokenizer", default=None, help="Tokenizer folder: random ids become text, as vLLM's dataset.")
    p.add_argument(
        "--prompt-format",
        choices=["auto", "text", "token-ids"],
        default="auto",
        help="text (needs --tokenizer) or token-ids ('prompt': [ids]); auto: text when --tokenizer is given.",
    )
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-prefix-len", type=int, default=0, help="Shared random prefix (W6: 2000).")
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument(
        "--random-vocab-size",
        type=int,
        default=None,
        help="Ids drawn from [0, V) (default: the tokenizer's vocabulary, else 10000).",
    )
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="Requests/s (default inf: all at once).")
    p.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape of the gaps (1 = Poisson).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="Default 0 (greedy).")
    p.add_argument("--no-ignore-eos", action="store_true", help="Do not send ignore_eos.")
    p.add_argument("--metric-percentiles", default=DEFAULT_METRIC_PERCENTILES)
    p.add_argument("--skip-initial-test", action="store_true", help="Skip the untimed first request.")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="First wait up to S seconds for GET /health to answer 200 (default 0: no wait). A server that accepts "
        "connections but is not ready (503, no answer yet) is waited for all S seconds; see --refused-timeout.",
    )
    p.add_argument(
        "--refused-timeout",
        type=float,
        default=None,
        metavar="S",
        help="While waiting for readiness, stop with an error once connections have been refused for S seconds in "
        f"a row: nothing listens (not started, or died at start) (default {DEFAULT_REFUSED_TIMEOUT:g}; 0: wait the "
        "whole --ready-timeout). brisk serve and vLLM refuse connections while they load the model, so S must be "
        "longer than the load.",
    )
    p.add_argument(
        "--server-pid",
        type=int,
        default=None,
        metavar="PID",
        help="While waiting for readiness, stop with an error as soon as process PID (the server) has exited.",
    )
    p.add_argument("--save-detailed", action="store_true", help="Per-request timings in the JSON.")
    p.add_argument("--label", default=None, help="A name for this run (e.g. W5-c16), kept in the JSON.")
    _add_common(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser(
        "write-config",
        help="Write a named model shape as a config-only folder (e.g. for brisk serve --load-format dummy).",
    )
    p.add_argument("name", choices=list(configs.NAMED_CONFIGS))
    p.add_argument("out", help="Folder to write config.json into.")
    p.add_argument("--tokenizer", default=None, help="Copy this folder's tokenizer files in.")
    p.add_argument("--vocab-size", type=int, default=None, help="Override vocab_size (e.g. to match a tokenizer).")
    p.set_defaults(func=_write_config)
    return parser
