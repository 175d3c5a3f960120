"""The synchronous engine: owns the scheduler, the KV cache manager and the model runner, and turns steps into
``RequestOutput``s (detokenized text, stop strings, logprobs, timings). ``LLM`` and the server both drive it."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from brisk.config import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    EngineArgs,
    ModelConfig,
    default_max_num_batched_tokens,
    preferred_dtype,
    read_hf_config,
    resolve_device,
    resolve_dtype,
)
from brisk.engine.constraints import RequestConstraints
from brisk.engine.detokenizer import IncrementalDetokenizer
from brisk.engine.generation_defaults import default_sampling_fields
from brisk.engine.kv_cache_manager import KVCacheManager
from brisk.engine.request import Request, RequestStatus
from brisk.engine.scheduler import Scheduler, SchedulerOutput, SchedulerStats
from brisk.engine.step_timeline import StepTimeline
from brisk.engine.tokenizer import load_tokenizer_in_background
from brisk.executor import create_executor
from brisk.layers.attention import ATTENTION_BACKENDS, FP8_KV_BACKENDS, default_backend
from brisk.layers.quantization import get_quantization_config
from brisk.layers.quantization.kv_cache import resolve_kv_cache_dtype
from brisk.outputs import CompletionOutput, DeltaOutputs, PositionLogprobs, RequestMetrics, RequestOutput
from brisk.sampling_params import RequestOutputKind, SamplingParams
from brisk.spec_decode.ngram_proposer import NgramProposer
from brisk.step_timer import StepTimer
from brisk.worker.model_runner import LaunchedStep, ModelRunnerOutput

logger = logging.getLogger(__name__)

EngineStats = SchedulerStats

# A stop string completed by the token that ended a request otherwise ends it instead (as in vLLM).
_YIELDS_TO_STOP_STRING = (RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_REPETITION)


@dataclass
class _Completion:
    """One of a parent request's ``n`` sequences and its detokenization state."""

    request: Request
    detokenizer: IncrementalDetokenizer | None  # None: decode once at the end (or never, without detokenize)
    finish_reason: str | None = None


@dataclass
class _ParentRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    completions: list[_Completion]
    metrics: RequestMetrics
    stream: bool
    deltas: DeltaOutputs | None = None  # streamed as RequestOutputKind.DELTA


@dataclass
class _BookedStep:
    """A finished step whose tokens are booked in the scheduler, waiting to be detokenized and emitted: the
    requests that took tokens, each with its output length before the step, and those a grammar ended."""

    schedule: SchedulerOutput
    live: list[tuple[Request, int]]
    grammar_done: set[str]
    now: float  # when the step's tokens were read back (wall clock)
    book_s: float  # the host's seconds booking them, for the step timeline


class LLMEngine:
    def __init__(self, args: EngineArgs):
        args.validate()
        self.args = args
        self.startup_seconds: dict[str, float] = {}  # seconds per start-up phase, logged once the engine is ready
        started = time.perf_counter()
        self.device = resolve_device(args.device)
        if self.device.type != "cuda" and args.gpu_memory_utilization is not None:
            raise ValueError(
                "gpu_memory_utilization sizes the KV cache on a GPU; on the CPU set kv_cache_memory_bytes "
                "(default 2 GiB) instead."
            )
        from brisk.loader.resolve import resolve_model

        path = resolve_model(
            str(args.model),
            preferred_dtype(args.dtype, self.device),
            revision=args.revision,
            download_dir=args.download_dir,
        )
        hf_config = read_hf_config(path, args.trust_remote_code)
        dtype = resolve_dtype(args.dtype, hf_config, self.device)
        self.model_config = ModelConfig.from_hf_config(path, hf_config, dtype, args.max_model_len)
        self.model_config.quant_config = get_quantization_config(args.quantization, hf_config)
        self.model_config.kv_cache_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype)
        self.model_config.trust_remote_code = args.trust_remote_code
        self.max_model_len = self.model_config.max_model_len
        # Random weights need no tokenizer (prompts of token ids), unless one was asked for.
        tokenizer = load_tokenizer_in_background(
            args.tokenizer or path,
            optional=args.load_format == "dummy" and args.tokenizer is None,
            trust_remote_code=args.trust_remote_code,
            use_snapshot=True,
        )
        self.default_sampling_fields = default_sampling_fields(path, args.generation_config)

        backend = args.attention_backend or default_backend(self.device)
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {backend!r}.")
        if backend == "flashinfer" and (self.device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16)):
            raise ValueError(
                f"attention_backend='flashinfer' runs on CUDA GPUs in float16 or bfloat16 (got {self.device.type}, "
                f"{str(dtype).removeprefix('torch.')}); choose another dtype, or attention_backend 'triton' or 'torch'."
            )
        if self.model_config.kv_cache_dtype is not None and backend not in FP8_KV_BACKENDS:
            raise ValueError(
                f"kv_cache_dtype={args.kv_cache_dtype!r} is not supported by attention_backend={backend!r}; "
                f"use attention_backend {' or '.join(repr(b) for b in FP8_KV_BACKENDS)}, or kv_cache_dtype 'auto'."
            )
        self.attention_backend = backend
        self.max_num_batched_tokens = args.max_num_batched_tokens or default_max_num_batched_tokens(
            self.device, args.serving
        )
        self.startup_seconds["config"] = time.perf_counter() - started
        with self._startup_phase("weights"):
            self.model_runner = create_executor(args, self.model_config, self.device, backend)
            self.speculative_config = args.parsed_speculative_config()
            self.proposer = self._make_proposer()
        with self._startup_phase("KV cache"):
            num_blocks = self._plan_kv_cache()
            self.model_runner.allocate_kv_cache(num_blocks)
            if self.drafter is not None:
                self.drafter.allocate_kv_cache(num_blocks)
        with self._startup_phase("step buffers and CUDA graphs"):
            k = self.speculative_config.num_speculative_tokens if self.speculative_config else 0
            self.model_runner.init_step_buffers(self.max_num_batched_tokens, args.max_num_seqs, args.enforce_eager, k)
        with self._startup_phase("tokenizer"):  # what of its loading the phases above did not hide
            self.tokenizer = tokenizer.result()
        self.eos_token_ids = self._eos_token_ids(path, hf_config)
        self.constraints = RequestConstraints(self.tokenizer, hf_config.vocab_size, self.eos_token_ids)
        self._new_scheduler(num_blocks)
        self._parents: dict[str, _ParentRequest] = {}
        self.async_scheduling = (
            args.async_scheduling
            if args.async_scheduling is not None
            else self.device.type == "cuda" and args.pipeline_parallel_size == 1
        )
        self._in_flight: LaunchedStep | None = None  # the step launched ahead (async scheduling)
        # How steps were launched: "ahead" of the last step's read-back (pipelined, async scheduling only), or
        # "waited" with no step in flight (they needed the last step's tokens, or the engine was idle); for
        # benchmarks and tests.
        self.launch_counts = {"ahead": 0, "waited": 0}
        self._pipeline: deque[LaunchedStep] = deque()  # pipeline parallelism: a batch per stage in flight
        self.step_timer = StepTimer(self.device)
        self._child_to_parent: dict[str, tuple[str, int]] = {}
        self.step_timeline = StepTimeline(path="")  # off for the warm-up
        if self.device.type == "cuda":
            with self._startup_phase("warm-up"):
                self.warm_up()
        self.step_timeline = StepTimeline()  # BRISK_STEP_TIMELINE=FILE: a line per step
        logger.info(
            "engine ready in %.1f s (%s)",
            time.perf_counter() - started,
            ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.startup_seconds.items()),
        )

    @contextmanager
    def _startup_phase(self, name: str) -> Iterator[None]:
        """Time one start-up phase into ``startup_seconds`` (the device is synchronized at its end, so that its
        queued kernels are billed to it)."""
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.startup_seconds[name] = time.perf_counter() - start

    def _new_scheduler(self, num_blocks: int) -> None:
        """An empty KV cache manager (no cached prefixes) and a scheduler with zeroed counters."""
        args = self.args
        self.kv_cache_manager = KVCacheManager(num_blocks, args.block_size, args.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.kv_cache_manager, self.max_num_batched_tokens, args.max_num_seqs, self.max_model_len
        )
        self.scheduler.defer_pending = args.pipeline_parallel_size > 1

    def warm_up(self) -> None:
        """Serve a few throwaway requests, then start again from an empty scheduler and KV cache manager.

        On a GPU the first request of each shape compiles Triton kernels (one sequence and a few, greedy and
        sampled, prefill and graphed decode): about a second that would otherwise land on the first user's
        request. Runs at startup on CUDA; it leaves no requests, cached prefixes or counters behind."""
        if self._parents:
            raise RuntimeError("warm_up() runs only on an idle engine.")
        vocab = self.model_config.hf_config.vocab_size
        # Token counts that are and are not multiples of 16, and batches of one and three: Triton specializes
        # integer arguments on both.
        batches = [[SamplingParams(temperature=0.0)], [SamplingParams(temperature=1.0)] * 3]
        for i, batch in enumerate(batches):
            for j, params in enumerate(batch):
                prompt_len = max(1, min(32 + i + j, self.max_model_len - 5))
                prompt = [(7 * (i + j) + k) % vocab for k in range(prompt_len)]
                max_tokens = min(4, self.max_model_len - prompt_len)
                params = replace(params, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
                self.add_request(f"warm-up-{i}-{j}", prompt, params, stream=False)
            while self.has_unfinished_requests() or self._in_flight is not None:  # also the step launched ahead
                self.step()
        self._new_scheduler(self.kv_cache_manager.pool.num_blocks)
        self.model_runner.reseed_sampler(self.args.seed)
        self.step_timer = StepTimer(self.device)
        self.launch_counts = dict.fromkeys(self.launch_counts, 0)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args)

    # ---- startup ------------------------------------------------------------------------------------------
    def _eos_token_ids(self, path, hf_config) -> frozenset[int]:
        ids: set[int] = set()
        gen_config = path / "generation_config.json"
        candidates = [getattr(hf_config, "eos_token_id", None)]
        if gen_config.is_file():
            import json

            candidates.append(json.loads(gen_config.read_text()).get("eos_token_id"))
        if self.tokenizer is not None:
            candidates.append(self.tokenizer.eos_token_id)
        for candidate in candidates:
            if isinstance(candidate, int):
                ids.add(candidate)
            elif isinstance(candidate, list):
                ids.update(c for c in candidate if isinstance(c, int))
        return frozenset(ids)

    def _make_proposer(self):
        """The speculative-decoding proposer, if any; a draft model also joins the model runner."""
        config = self.speculative_config
        self.drafter = None  # a draft model (one rank only: the workers of several ranks run none yet)
        if config is None:
            return None
        logger.info(
            "speculative decoding: %s, %d tokens a step, %s",
            config.method if config.model is None else f"{config.method} {config.model}",
            config.num_speculative_tokens,
            "at every batch size"
            if config.disable_by_batch_size is None
            else f"while fewer than {config.disable_by_batch_size} requests run (disable_by_batch_size)",
        )
        if config.method == "ngram":
            return NgramProposer(config)
        from brisk.spec_decode.draft_model import DraftModelProposer

        args = self.args
        drafter = DraftModelProposer(
            config, self.model_config, self.device, args.block_size, self.attention_backend, args.load_format, args.seed
        )
        self.model_runner.drafter = self.drafter = drafter
        return drafter

    def _plan_kv_cache(self) -> int:
        args = self.args
        per_block = self.model_runner.kv_cache_bytes_per_block()
        drafter = self.drafter
        if drafter is not None:  # one block table addresses both caches: a block costs the sum
            per_block += drafter.kv_cache_bytes_per_block()
        if args.kv_cache_memory_bytes is not None:
            budget, knob = args.kv_cache_memory_bytes, "kv_cache_memory_bytes"
        elif self.device.type == "cuda":
            fraction = args.gpu_memory_utilization
            budget = self.model_runner.profile_available_kv_bytes(
                DEFAULT_GPU_MEMORY_UTILIZATION if fraction is None else fraction, self.max_num_batched_tokens
            )
            knob = "gpu_memory_utilization"
        else:
            budget, knob = DEFAULT_CPU_KV_CACHE_BYTES, "kv_cache_memory_bytes"
        num_blocks = budget // per_block
        needed = -(-self.max_model_len // args.block_size)
        if num_blocks < needed:
            bytes_per_token = per_block // args.block_size
            raise ValueError(
                f"The KV cache cannot hold one sequence of max_model_len={self.max_model_len} tokens: "
                f"{bytes_per_token} bytes per token, budget {budget} bytes = {num_blocks} blocks of "
                f"{args.block_size} tokens, need {needed} blocks ({needed * per_block} bytes). "
                f"Raise {knob}, or lower max_model_len to at most {num_blocks * args.block_size}."
            )
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB) per rank; weights %.2f GiB per rank (%d ranks); "
            "max concurrency %.1f sequences of max_model_len=%d",
            num_blocks,
            args.block_size,
            num_blocks * args.block_size,
            num_blocks * per_block / 2**30,
            self.model_runner.weight_bytes() / 2**30,
            args.world_size,
            num_blocks * args.block_size / self.max_model_len,
            self.max_model_len,
        )
        if drafter is not None:
            logger.info(
                "KV cache of the draft model, same blocks: %.2f GiB of them (the target's: %.2f GiB)",
                num_blocks * drafter.kv_cache_bytes_per_block() / 2**30,
                num_blocks * self.model_runner.kv_cache_bytes_per_block() / 2**30,
            )
        return num_blocks

    # ---- requests -----------------------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int] | Mapping) -> tuple[str | None, list[int]]:
        """The prompt's text (None for token ids alone) and its token ids. Besides a string or a list of ids, a
        prompt can be one of vLLM's prompt dicts: ``{"prompt": text}`` or ``{"prompt_token_ids": ids}`` (with
        an optional ``"prompt"``: the ids' text, reported in the output), either with an optional
        ``"cache_salt"`` (the prefix cache shares blocks only between requests of the same salt)."""
        if isinstance(prompt, Mapping):
            return self._tokenize_prompt_dict(prompt)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("This model has no tokenizer: pass prompts as lists of token ids.")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        if not _is_token_ids(prompt):
            raise ValueError(
                'A prompt must be a string, a list of integer token ids, {"prompt": text} or {"prompt_token_ids": ids}.'
            )
        return None, list(prompt)

    def _tokenize_prompt_dict(self, prompt: Mapping) -> tuple[str | None, list[int]]:
        # Fields that ask for something brisk lacks are refused; the same fields left empty ask for nothing.
        unsupported = sorted(k for k, v in prompt.items() if k not in _PROMPT_DICT_FIELDS and v)
        if unsupported:
            raise ValueError(f"Prompt fields {unsupported} are not supported: brisk takes text and token ids only.")
        text = prompt.get("prompt")
        if text is not None and not isinstance(text, str):
            raise ValueError(f'"prompt" must be a string, got {type(text).__name__}.')
        if prompt.get("prompt_token_ids") is not None:
            if not _is_token_ids(prompt["prompt_token_ids"]):
                raise ValueError('"prompt_token_ids" must be a list of integer token ids.')
            return text, list(prompt["prompt_token_ids"])
        if text is None:
            raise ValueError('A prompt dict needs "prompt" (text) or "prompt_token_ids" (a list of token ids).')
        return self.tokenize(text)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        stream: bool = True,
    ) -> None:
        """Queue a request. With ``stream=False`` its output is returned only once, when it finishes, and text
        is decoded once at the end unless stop strings need watching (cheaper for offline batches). Streamed,
        each step's output follows ``params.output_kind``: cumulative, only what is new (``DELTA``), or, with
        ``FINAL_ONLY``, as ``stream=False``."""
        params = params or SamplingParams()
        stream = stream and params.output_kind is not RequestOutputKind.FINAL_ONLY
        child_ids = [request_id] if params.n == 1 else [f"{index}_{request_id}" for index in range(params.n)]
        taken = sorted(i for i in {request_id, *child_ids} if i in self._parents or i in self._child_to_parent)
        if taken:  # the n sequences of a request are named "{index}_{request_id}": those names are taken too
            raise ValueError(f"request_id {request_id!r} is already in use (by {', '.join(map(repr, taken))}).")
        text, token_ids = self.tokenize(prompt)
        cache_salt = _cache_salt(prompt)
        self._validate_prompt(token_ids)
        self._validate_token_ids(params.stop_token_ids, "stop_token_ids")
        self._validate_token_ids(params.logprob_token_ids or [], "logprob_token_ids")
        self.constraints.check(params)
        arrival_time = arrival_time if arrival_time is not None else time.time()
        completions = []
        for index in range(params.n):
            child_params = params
            if params.n > 1:
                seed = None if params.seed is None else params.seed + index
                # The prompt's logprobs are the same for every sequence: only the first computes them; the
                # others read its KV blocks from the prefix cache (a request owed prompt logprobs cannot).
                prompt_logprobs = params.prompt_logprobs if index == 0 else None
                child_params = replace(params, n=1, seed=seed, prompt_logprobs=prompt_logprobs)
            request = Request(child_ids[index], token_ids, child_params, self.eos_token_ids, arrival_time, cache_salt)
            detok = None
            if params.detokenize and self.tokenizer is not None and (stream or params.stop):
                detok = IncrementalDetokenizer(
                    self.tokenizer,
                    token_ids,
                    params.stop,
                    params.skip_special_tokens,
                    params.include_stop_str_in_output,
                )
            completions.append(_Completion(request, detok))
        for index, completion in enumerate(completions):  # registered once every child is built
            self._child_to_parent[completion.request.request_id] = (request_id, index)
        deltas = DeltaOutputs() if stream and params.output_kind is RequestOutputKind.DELTA else None
        self._parents[request_id] = _ParentRequest(
            request_id, text, token_ids, completions, RequestMetrics(arrival_time), stream, deltas
        )
        requests = [completion.request for completion in completions]
        if not self.constraints.hold(params, requests):  # held: a grammar compiles first
            for request in requests:
                self.scheduler.add_request(request)

    def _validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("The prompt is empty: give at least one token.")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len}: it must be "
                f"shorter (at least one token must be left to generate). Shorten the prompt or raise max_model_len."
            )
        self._validate_token_ids(token_ids, "prompt")

    def _validate_token_ids(self, token_ids: list[int], param: str) -> None:
        vocab = self.model_config.hf_config.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            where = "" if param == "prompt" else f" in {param}"
            raise ValueError(f"Token id {bad}{where} is outside the vocabulary [0, {vocab}).")

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for request_id in request_ids:
            parent = self._parents.get(request_id)
            if parent is None:
                continue
            children = [c.request.request_id for c in parent.completions]
            self.scheduler.finish_requests(children, RequestStatus.FINISHED_ABORTED)
            for completion in parent.completions:
                completion.finish_reason = completion.finish_reason or "abort"
            self._forget(parent)

    def _forget(self, parent: _ParentRequest) -> None:
        del self._parents[parent.request_id]
        for completion in parent.completions:
            self._child_to_parent.pop(completion.request.request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._parents)

    def get_num_unfinished_requests(self) -> int:
        return len(self._parents)

    def get_stats(self) -> EngineStats:
        return self.scheduler.get_stats()

    # ---- the step -----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step and return the outputs it produced.

        With async scheduling the next step is scheduled and launched before this one's tokens are read back,
        so the device runs step N+1 while the host applies step N's results. Some steps need the last one's
        tokens first: while a request's sampling needs its whole token history on the host (penalties,
        grammars), and while speculative decoding proposes drafts (a proposer needs the last step's tokens, and
        the step after a verification starts where its accepted drafts end, which only the read-back tells).
        Such a step is launched as soon as those tokens are booked in the scheduler, before they are detokenized
        and emitted, so the device waits only for the host's bookkeeping and the step's preparation (unless the
        launch itself would wait for the device: then the outputs go first). The n-gram
        proposer often finds nothing to propose; where its lookup over the tokens known so far finds nothing for
        any request, the next step is launched ahead without drafts (a match is then acted on one step later:
        that step waits, and the one after it carries the drafts). For the same reason pipeline parallelism
        keeps no batches in flight while the engine speculates."""
        self.step_timer.start()
        failed = self._admit_compiled_grammars() if self.constraints.has_pending else []
        if self.args.pipeline_parallel_size > 1 and (self._pipeline or not self._speculating()):
            return failed + self._pipelined_step()  # speculative steps wait for the batches in flight
        current, self._in_flight = self._in_flight, None
        if current is None:
            if self._speculating():
                self._propose_drafts()
            current = self._launch()
            self.launch_counts["waited"] += current is not None
            if current is None:
                if self.scheduler.has_unfinished_requests() and not self.scheduler.running:
                    raise RuntimeError("scheduler made no progress with requests waiting (KV cache too small?)")
                return failed
        if self.async_scheduling and not (
            self.scheduler.needs_sync or current.schedule.spec_token_ids or self._drafts_expected()
        ):
            self._in_flight = self._launch()
            self.launch_counts["ahead"] += self._in_flight is not None
            return failed + self._apply(current.schedule, current.result())
        booked = self._book(current.schedule, current.result())
        if self.async_scheduling and not self._launch_waits():
            # The next step, which needed these tokens, runs while they are emitted.
            if self._speculating():
                self._propose_drafts()
            self._in_flight = self._launch()
            self.launch_counts["waited"] += self._in_flight is not None
        return failed + self._outputs(booked)

    def _launch_waits(self) -> bool:
        """Whether launching the next step would wait for the device (logprobs read back, a verification with
        sampled rows): then this step's outputs go first, and the next call launches it."""
        requests = itertools.chain(self.scheduler.running, self.scheduler.waiting)
        return self.model_runner.waits_at_launch(requests, self._speculating())

    def _admit_compiled_grammars(self) -> list[RequestOutput]:
        """Schedule the requests whose grammar is compiled; end those whose grammar failed (finish reason
        "abort", an error in the log)."""
        idle = not self.scheduler.has_unfinished_requests() and self._in_flight is None
        admitted, failed = self.constraints.ready(idle)
        for request in admitted:
            if request.request_id in self._child_to_parent:  # not aborted meanwhile
                self.scheduler.add_request(request)
        parents = {}
        for request in failed:
            if request.request_id in self._child_to_parent:
                parent_id, index = self._child_to_parent[request.request_id]
                parents[parent_id] = self._parents[parent_id]
                parents[parent_id].completions[index].finish_reason = "abort"
        return [self._emit(parent, time.time()) for parent in parents.values()]

    def _speculating(self) -> bool:
        """Whether the next step gets drafts: speculation is on and the batch is small enough for it to pay
        (the load-aware rule). Such steps run one at a time, not pipelined."""
        return self.proposer is not None and self.speculative_config.is_active(len(self.scheduler.running))

    def _drafts_expected(self) -> bool:
        """Whether the next step is to wait for this one's tokens because its proposal may have drafts: the
        proposer may propose for a running request, judged on the tokens known now."""
        return self._speculating() and any(
            not request.sampling_params.has_token_constraints and self.proposer.may_propose(request)
            for request in self.scheduler.running
        )

    def _propose_drafts(self) -> None:
        """Each running request that is decoding, with nothing in flight, gets its drafts for the next step (not
        those whose logits constraints verification does not apply: they decode one token a step)."""
        for request in self.scheduler.running:
            if (
                request.num_computed_tokens == request.num_tokens - 1
                and not request.num_pending_tokens
                and not request.sampling_params.has_token_constraints
            ):
                limit = self.scheduler.max_num_drafts(request)
                request.spec_token_ids = self.proposer.propose(request, limit)

    def _pipelined_step(self) -> list[RequestOutput]:
        """Pipeline parallelism: keep one batch in flight per stage (each later batch holds the requests not
        waiting for a token in flight), then apply the oldest, so no stage idles while the others compute."""
        while len(self._pipeline) < self.args.pipeline_parallel_size and not self._speculating():
            launched = self._launch()
            if launched is None:
                break
            self._pipeline.append(launched)
        if not self._pipeline:
            if self.scheduler.has_unfinished_requests() and not self.scheduler.running:
                raise RuntimeError("scheduler made no progress with requests waiting (KV cache too small?)")
            return []
        current = self._pipeline.popleft()
        return self._apply(current.schedule, current.result())

    def _launch(self) -> LaunchedStep | None:
        schedule = self.scheduler.schedule()
        self.step_timer.mark("schedule")
        if schedule.is_empty:
            return None
        return self.model_runner.execute(schedule, self.step_timer)

    def _apply(self, schedule: SchedulerOutput, result: ModelRunnerOutput) -> list[RequestOutput]:
        """Book a finished step's tokens, then detokenize them and make the outputs."""
        return self._outputs(self._book(schedule, result))

    def _book(self, schedule: SchedulerOutput, result: ModelRunnerOutput) -> _BookedStep:
        """What the next step's scheduling needs of a finished one: its tokens, accepted drafts and logprobs in
        the requests, and the stops that tokens and grammars make (their requests end and free their blocks).
        Stop strings wait for :meth:`_outputs`, which detokenizes."""
        timer = self.step_timer
        book_started = time.perf_counter()
        now = time.time()
        if result.prompt_logprobs:  # to the step's own requests (an aborted one's id may have been reused since)
            stepped = {entry.request.request_id: entry.request for entry in schedule.scheduled}
            for request_id, (start, entries) in result.prompt_logprobs.items():
                req = stepped[request_id]
                if not req.is_finished and len(req.prompt_logprobs) == start:
                    req.prompt_logprobs.extend(entries)
        # Requests still running (not aborted meanwhile) that sampled, with their output length before the step
        # (a speculative row may add several tokens).
        live: list[tuple[Request, int]] = []
        rows: list[int] = []
        for row, (entry, token) in enumerate(zip(schedule.scheduled, result.sampled_token_ids)):
            request = entry.request
            if token is None or request.is_finished:
                continue
            live.append((request, request.num_output_tokens))
            rows.append(row)
            if request.first_token_time is None:
                request.first_token_time = now
            request.last_token_time = now
        self.scheduler.update_from_output(schedule, result.sampled_token_ids, result.accepted_drafts)
        for (request, before), row in zip(live, rows):
            self._append_logprobs(request, request.num_output_tokens - before, result, row)
        # A complete grammar (or one that allows nothing more) ends its request here, so no later step holds it.
        grammar_done = {
            request.request_id
            for request, _ in live
            if request.grammar is not None and request.grammar.done and not request.is_finished
        }
        self.scheduler.finish_requests(grammar_done, RequestStatus.FINISHED_STOPPED)
        timer.mark("update")
        return _BookedStep(schedule, live, grammar_done, now, time.perf_counter() - book_started)

    def _outputs(self, booked: _BookedStep) -> list[RequestOutput]:
        """Detokenize a booked step's tokens (a stop string ends its request and drops the tokens after it) and
        make the outputs."""
        outputs_started = time.perf_counter()
        schedule, live, now, timer = booked.schedule, booked.live, booked.now, self.step_timer
        touched: dict[str, _ParentRequest] = {}
        stopped_by_string: list[str] = []
        for request, before in live:
            parent_id, index = self._child_to_parent[request.request_id]
            parent = self._parents[parent_id]
            completion = parent.completions[index]
            if completion.detokenizer is not None:
                for position in range(before, request.num_output_tokens):
                    check = position + 1 > request.sampling_params.min_tokens
                    stop = completion.detokenizer.append(request.output_token_ids[position], check_stop=check)
                    if stop is None:
                        continue
                    # A stop string ends the text: tokens emitted after it in the same step are dropped.
                    truncated = position + 1 < request.num_output_tokens
                    request.truncate_output(position + 1)
                    if not request.is_finished:
                        request.stop_reason = stop
                        stopped_by_string.append(request.request_id)
                    elif (
                        truncated
                        or request.status in _YIELDS_TO_STOP_STRING
                        or request.request_id in booked.grammar_done
                    ):
                        # The text ends at the stop string before whatever else would have ended it.
                        request.stop_reason = stop
                        request.status = RequestStatus.FINISHED_STOPPED
                    break
            touched[parent_id] = parent
        self.scheduler.finish_requests(stopped_by_string, RequestStatus.FINISHED_STOPPED)
        outputs = []
        for parent in touched.values():
            for completion in parent.completions:
                if completion.request.is_finished and completion.finish_reason is None:
                    completion.finish_reason = completion.request.status.finish_reason
                    if completion.detokenizer is not None and not isinstance(completion.request.stop_reason, str):
                        completion.detokenizer.flush()
            if parent.stream or all(c.finish_reason is not None for c in parent.completions):
                outputs.append(self._emit(parent, now))
        timer.mark("outputs")
        if self.step_timeline.enabled:
            apply_s = booked.book_s + time.perf_counter() - outputs_started
            self.step_timeline.record(schedule, apply_s, len(self.scheduler.running), len(self.scheduler.waiting))
        return outputs

    @staticmethod
    def _append_logprobs(request: Request, num_new: int, result: ModelRunnerOutput, row: int) -> None:
        """Logprobs of the ``num_new`` tokens the row added: its accepted drafts', then its sampled token's."""
        if request.logprobs is None or num_new <= 0:
            return
        entries, chosen = [], []
        if result.accepted_drafts and result.accepted_draft_logprobs[row] is not None:
            entries, chosen = map(list, result.accepted_draft_logprobs[row])
        if result.logprobs[row] is not None:
            entries.append(result.logprobs[row])
            chosen.append(result.chosen_logprobs[row])
        request.logprobs.extend(entries[:num_new])
        request.cumulative_logprob += sum(chosen[:num_new])

    def _emit(self, parent: _ParentRequest, now: float) -> RequestOutput:
        """The parent's output as its stream wants it: cumulative, or what is new (``DELTA``)."""
        output = self._make_output(parent, now)
        return output if parent.deltas is None else parent.deltas.delta(output)

    def _make_output(self, parent: _ParentRequest, now: float) -> RequestOutput:
        finished = all(c.finish_reason is not None for c in parent.completions)
        metrics = parent.metrics
        first_req = parent.completions[0].request
        # The earliest child's times; once set they cannot change (later children come later).
        if metrics.first_scheduled_time is None:
            metrics.first_scheduled_time = min(
                (c.request.first_scheduled_time for c in parent.completions if c.request.first_scheduled_time),
                default=None,
            )
        if metrics.first_token_time is None:
            metrics.first_token_time = min(
                (c.request.first_token_time for c in parent.completions if c.request.first_token_time),
                default=None,
            )
        metrics.last_token_time = now
        children = [c.request for c in parent.completions]
        metrics.num_draft_tokens = sum(r.num_draft_tokens for r in children)
        metrics.num_accepted_tokens = sum(r.num_accepted_tokens for r in children)
        metrics.num_spec_steps = sum(r.num_spec_steps for r in children)
        if finished:
            metrics.finished_time = now
            self._forget(parent)
        outs = [self._completion_output(i, c) for i, c in enumerate(parent.completions)]
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=outs,
            finished=finished,
            metrics=metrics,
            prompt_logprobs=self._decorate(first_req.prompt_logprobs),
            num_cached_tokens=max(first_req.num_cached_tokens, 0),
        )

    def _completion_output(self, index: int, completion: _Completion) -> CompletionOutput:
        request = completion.request
        finished = completion.finish_reason is not None
        params = request.sampling_params
        if completion.detokenizer is not None:
            text = completion.detokenizer.visible_text(finished)
        elif params.detokenize and self.tokenizer is not None:
            text = self.tokenizer.decode(request.output_token_ids, skip_special_tokens=params.skip_special_tokens)
        else:
            text = ""
        return CompletionOutput(
            index=index,
            text=text,
            token_ids=list(request.output_token_ids),
            cumulative_logprob=request.cumulative_logprob if params.num_logprobs is not None else None,
            logprobs=self._decorate(request.logprobs),
            finish_reason=completion.finish_reason,
            stop_reason=request.stop_reason,
        )

    def _decorate(self, positions: list[PositionLogprobs | None] | None):
        """Fill in each Logprob's decoded token text, once."""
        if positions is None or self.tokenizer is None:
            return positions
        for position in positions:
            if position is None:
                continue
            for token_id, logprob in position.items():
                if logprob.decoded_token is None:
                    logprob.decoded_token = self.tokenizer.decode([token_id])
        return list(positions)


_PROMPT_DICT_FIELDS = ("prompt", "prompt_token_ids", "cache_salt")  # what brisk reads of vLLM's prompt dicts


def _cache_salt(prompt: str | list[int] | Mapping) -> str | None:
    """A prompt dict's ``cache_salt``: a non-empty string, or None (vLLM's rule)."""
    salt = prompt.get("cache_salt") if isinstance(prompt, Mapping) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError('"cache_salt" must be a non-empty string if provided.')
    return salt


def _is_token_ids(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
