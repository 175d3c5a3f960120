"""What ``brisk generate`` and ``brisk chat`` share: model, sampling and engine flags, a quiet engine start, and
the streaming loop (``LLMEngine.add_request`` + ``step()``, printing each new piece of ``outputs[0].text``)."""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from brisk.entrypoints.cli.engine_args import (
    PARALLEL_FLAGS,
    add_parallel_arguments,
    add_speculative_arguments,
    parse_bytes,
    positive_int,
    speculative_config,
)
from brisk.loader.resolve import DEFAULT_MODEL

DEFAULT_MAX_TOKENS = 256
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.9
# The sampling flags' values when neither the flag nor the model's generation_config.json sets them.
CLI_SAMPLING_DEFAULTS = {
    "temperature": DEFAULT_TEMPERATURE,
    "top_p": DEFAULT_TOP_P,
    "top_k": 0,
    "repetition_penalty": 1.0,
}
MODEL_DEFAULT = "the model's generation_config.json, else"

# SamplingParams field -> the flag that sets it, so a bad value is reported in the user's terms.
SAMPLING_FLAGS = {
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "repetition_penalty": "--repetition-penalty",
    "stop": "--stop",
    "seed": "--seed",
}


# ---- arguments ------------------------------------------------------------------------------------------------
def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` report a bad or unknown flag as one line on stderr (exit 2) instead of usage + error.

    Unknown flags are caught here too: left alone, the sub-parser hands them up to the top-level parser, which
    prints its own usage block."""
    prog = parser.prog

    def error(message: str):
        parser.exit(2, f"{prog}: error: {message} (see '{prog} --help')\n")

    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        namespace, extras = original(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    return parser


def add_model_and_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        "-m",
        default=DEFAULT_MODEL,
        help=f"An HF folder, a .gguf file, a known name or a hub id org/name (default: {DEFAULT_MODEL}).",
    )
    parser.add_argument("--revision", default=None, help="Hub ids: the branch, tag or commit (default: main).")
    parser.add_argument(
        "--download-dir", default=None, help="Hub ids: download here (default: the Hugging Face cache)."
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="Run the config and tokenizer classes the model folder ships (auto_map) through transformers.",
    )
    parser.add_argument(
        "--system", default=None, help="A system message (default: the chat template's own, if it has one)."
    )
    g = parser.add_argument_group("sampling")
    g.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"Most tokens to generate per reply (default: {DEFAULT_MAX_TOKENS}).",
    )
    g.add_argument(
        "--temperature",
        "-t",
        type=float,
        default=None,
        help=f"Sampling temperature; 0 = greedy (default: {MODEL_DEFAULT} {DEFAULT_TEMPERATURE}).",
    )
    g.add_argument(
        "--top-p", type=float, default=None, help=f"Nucleus sampling mass (default: {MODEL_DEFAULT} {DEFAULT_TOP_P})."
    )
    g.add_argument(
        "--top-k",
        type=int,
        default=None,
        help=f"Sample from the k most likely tokens only (default: {MODEL_DEFAULT} 0, off).",
    )
    g.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help=f"Penalize tokens already seen (default: {MODEL_DEFAULT} 1.0, off).",
    )
    g.add_argument(
        "--stop", action="append", default=None, metavar="TEXT", help="Stop at this text (repeatable; not shown)."
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        help="Sampling seed (default: none: the engine's generator, seeded with 0 at start, so a fresh run repeats).",
    )
    g.add_argument("--ignore-eos", action="store_true", help="Keep generating past the end-of-sequence token.")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto).")
    g.add_argument(
        "--dtype", default="auto", help="auto, float32, float16 or bfloat16 (default: auto: float32 on CPU)."
    )
    g.add_argument("--max-model-len", type=positive_int, default=None, help="Context length (default: the model's).")
    g.add_argument(
        "--kv-cache-memory-bytes",
        type=parse_bytes,
        default=None,
        metavar="BYTES",
        help="KV-cache size, e.g. 512MiB (default: on CPU, what one sequence of --max-model-len needs).",
    )
    g.add_argument(
        "--quantization",
        default=None,
        help="fp8 (quantize the weights while loading), or the checkpoint's format (default: its quantization_config).",
    )
    g.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's dtype) or fp8 (default: auto).")
    g.add_argument(
        "--generation-config",
        default="auto",
        help="Where sampling flags left out take their values: auto (the model's generation_config.json), vllm "
        "(the CLI's defaults) or a folder holding a generation_config.json (default: auto).",
    )
    g.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: one per core).")
    add_speculative_arguments(g)
    add_parallel_arguments(g)
    g.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="Log the engine's start-up to stderr (chat: also each turn's full prompt and stats).",
    )


def sampling_params_from_args(args: argparse.Namespace, model_defaults: dict | None = None):
    """``SamplingParams`` from the flags; a bad value raises ValueError naming the flag (checked before loading,
    with no ``model_defaults``). A sampling flag left out takes the model's recommended value
    (``model_defaults``: the engine's ``default_sampling_fields``, from its ``generation_config.json`` as vLLM
    reads it; ``--generation-config vllm`` leaves none), else the CLI's default; ``--max-tokens`` keeps its own
    default, which suits a terminal."""
    from brisk.engine.generation_defaults import SAMPLING_FIELDS
    from brisk.sampling_params import SamplingParams, error_field

    fields = {**CLI_SAMPLING_DEFAULTS, **{k: v for k, v in (model_defaults or {}).items() if k in SAMPLING_FIELDS}}
    fields |= {name: getattr(args, name) for name in CLI_SAMPLING_DEFAULTS if getattr(args, name) is not None}
    try:
        return SamplingParams(
            max_tokens=args.max_tokens, stop=args.stop, seed=args.seed, ignore_eos=args.ignore_eos, **fields
        )
    except ValueError as exc:
        field, rest = error_field(str(exc))
        raise ValueError(f"{SAMPLING_FLAGS[field]} {rest}" if field in SAMPLING_FLAGS else str(exc)) from None


# ---- engine -------------------------------------------------------------------------------------------------------
def quiet_startup(verbose: bool) -> None:
    """Nothing but the model's text on stdout: no progress bars, transformers warnings only as errors."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not verbose:  # read by transformers when it is imported (only if a tokenizer or a foreign config needs it)
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
        if "transformers" in sys.modules:  # imported already: too late for the environment
            transformers = sys.modules["transformers"]
            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def _one_sequence_kv_bytes(engine_args) -> int | None:
    """On CPU, a KV cache for one sequence of max_model_len tokens (instead of the engine's 2 GiB default):
    these commands run one request at a time, and a smaller cache starts faster and uses less memory."""
    from brisk.config import (
        DEFAULT_CPU_KV_CACHE_BYTES,
        ModelConfig,
        preferred_dtype,
        read_hf_config,
        resolve_device,
        resolve_dtype,
    )
    from brisk.layers.quantization.kv_cache import resolve_kv_cache_dtype
    from brisk.loader.resolve import resolve_model

    device = resolve_device(engine_args.device)
    if device.type != "cpu":
        return None
    path = resolve_model(
        engine_args.model,
        preferred_dtype(engine_args.dtype, device),
        revision=engine_args.revision,
        download_dir=engine_args.download_dir,
    )
    hf_config = read_hf_config(path, engine_args.trust_remote_code)
    dtype = resolve_dtype(engine_args.dtype, hf_config, device)
    config = ModelConfig.from_hf_config(path, hf_config, dtype, engine_args.max_model_len)
    block = engine_args.block_size
    kv_dtype = resolve_kv_cache_dtype(engine_args.kv_cache_dtype) or dtype
    needed = (-(-config.max_model_len // block) + 1) * block * config.kv_bytes_per_token(kv_dtype)
    return needed if needed < DEFAULT_CPU_KV_CACHE_BYTES else None


def one_line_error(message: str) -> str:
    """resolve_model's errors list the accepted forms over many lines: keep the reason, name the known models."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) <= 2:  # e.g. "... is not installed. Install it with:" + the pip command
        return " ".join(lines)
    from brisk.loader.resolve import KNOWN_MODELS

    return (
        f"{lines[0]} Give an HF checkpoint folder, a .gguf file, an org/name in the local HF cache, or a known "
        f"name: {', '.join(KNOWN_MODELS)} (see docs/models.md)."
    )


def engine_args_from_args(args: argparse.Namespace):
    """``EngineArgs`` from the flags, validated (nothing is loaded): bad values raise a one-line ValueError."""
    from brisk.config import EngineArgs

    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {args.threads}.")
    engine_args = EngineArgs(
        model=args.model,
        revision=args.revision,
        download_dir=args.download_dir,
        trust_remote_code=args.trust_remote_code,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        speculative_config=speculative_config(args),
        **{name: getattr(args, name) for name in PARALLEL_FLAGS if getattr(args, name) is not None},
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        cpu_threads=args.threads,
        generation_config=args.generation_config,
    )
    engine_args.validate()
    return engine_args


def build_engine(engine_args):
    """An ``LLMEngine``; a missing model raises a one-line FileNotFoundError."""
    from brisk.engine.engine import LLMEngine

    try:
        if engine_args.kv_cache_memory_bytes is None:
            engine_args.kv_cache_memory_bytes = _one_sequence_kv_bytes(engine_args)
        return LLMEngine(engine_args)
    except FileNotFoundError as exc:
        raise FileNotFoundError(one_line_error(str(exc))) from None


def chat_prompt_ids(engine, messages: list[dict], no_template_hint: str = "use --raw") -> list[int]:
    """The conversation through the model's chat template, ending with the assistant's turn, as token ids."""
    from jinja2 import TemplateError

    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ValueError("This model has no tokenizer, so its chat template cannot be applied.")
    if tokenizer.chat_template is None:
        raise ValueError(
            f"This model's tokenizer has no chat template: {no_template_hint} to complete the prompt as-is."
        )
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except TemplateError as exc:  # raise_exception() in templates: "System role not supported", ...
        raise ValueError(f"The model's chat template refuses this conversation: {exc}") from None
    # The template already holds BOS where the model wants it: do not add special tokens again.
    return tokenizer.encode(text, add_special_tokens=False)


# ---- streaming ----------------------------------------------------------------------------------------------------
@dataclass
class StreamResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None
    total_s: float
    time_to_first_token_s: float | None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the first (the decode rate, prefill excluded)."""
        if self.time_to_first_token_s is None or self.num_tokens < 2:
            return None
        decode_s = self.total_s - self.time_to_first_token_s
        return (self.num_tokens - 1) / decode_s if decode_s > 0 else None

    def stats_line(self) -> str:
        ttft = "n/a" if self.time_to_first_token_s is None else f"{self.time_to_first_token_s:.2f} s"
        return (
            f"{self.num_tokens} tokens in {self.total_s:.2f} s ({self.tokens_per_s:.1f} tok/s), "
            f"time to first token {ttft}"
        )


_request_ids = itertools.count()


def stream(engine, prompt, params, on_delta: Callable[[str], None] | None = None) -> StreamResult:
    """Run one request to the end, calling ``on_delta`` with each new piece of text as soon as a step makes it.

    ``prompt`` is a string (tokenized with the tokenizer's special tokens) or a list of token ids. On
    KeyboardInterrupt the request is aborted before the exception propagates."""
    request_id = f"cli-{next(_request_ids)}"
    start = time.perf_counter()
    first_token_s = None
    shown = ""
    last = None
    engine.add_request(request_id, prompt, params)
    try:
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.request_id != request_id:
                    continue
                last = output
                completion = output.outputs[0]
                if first_token_s is None and completion.token_ids:
                    first_token_s = time.perf_counter() - start
                text = completion.text
                if on_delta is not None and len(text) > len(shown):
                    # The engine never takes text back (stop strings are held back), so this is a plain suffix.
                    on_delta(text[len(shown) :] if text.startswith(shown) else text[_common_prefix(text, shown) :])
                    shown = text
                if output.finished:
                    break
            if last is not None and last.finished:
                break
    except BaseException:
        engine.abort_request(request_id)
        raise
    total = time.perf_counter() - start
    if last is None:
        raise RuntimeError("the engine finished without producing any output")
    completion = last.outputs[0]
    return StreamResult(
        text=completion.text,
        token_ids=list(completion.token_ids),
        prompt_token_ids=list(last.prompt_token_ids),
        finish_reason=completion.finish_reason,
        stop_reason=completion.stop_reason,
        total_s=total,
        time_to_first_token_s=first_token_s,
    )


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def silence_broken_stdout() -> None:
    """After a BrokenPipeError (``brisk generate ... | head``): point stdout at /dev/null so the interpreter's
    final flush does not print a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
