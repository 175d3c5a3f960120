"""The model runner: the only place that builds tensors per step (input ids, positions, slot mapping, block
tables), runs the model over the paged KV cache and samples.

``execute`` only launches a step and returns a ``LaunchedStep``; its ``result()`` waits for the sampled tokens.
In between the engine may launch the next step, whose decode rows read their input tokens straight from this
step's sampled ids on the device (``InputBuffers``: an input id ``-1 - row``), so the host never stalls the device."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from brisk.config import ModelConfig
from brisk.device_transfer import to_device_async
from brisk.distributed.parallel_state import is_last_stage
from brisk.engine.request import Request
from brisk.engine.scheduler import ScheduledRequest, SchedulerOutput
from brisk.forward_context import set_forward_context
from brisk.layers.attention.backend import AttentionMetadata
from brisk.loader.weights import load_model
from brisk.outputs import PositionLogprobs
from brisk.spec_decode.rejection_sampler import PendingVerification, RejectionSampler, Verification
from brisk.step_timer import StepTimer
from brisk.worker.cuda_graphs import (
    PackedStepGraphs,
    StepGraphs,
    capture_graph_sets,
    capture_sizes,
    mixed_graph_tokens,
    prefill_query_lens,
    verify_capture_sizes,
)
from brisk.worker.input_buffers import InputBuffers
from brisk.worker.sampler import Sampler, prompt_position_logprobs

if TYPE_CHECKING:
    from brisk.spec_decode.draft_model import DraftTokens

logger = logging.getLogger(__name__)

PROMPT_LOGPROBS_ROWS = 256  # prompt positions whose logprobs are computed at once


@dataclass
class ModelRunnerOutput:
    """Per scheduled request, in batch order: the sampled token (None for a prompt chunk that did not reach the
    end) and its logprobs; plus prompt logprobs as (first position, entries) per request that asked for them."""

    sampled_token_ids: list[int | None]
    logprobs: list[PositionLogprobs | None]
    chosen_logprobs: list[float | None]
    prompt_logprobs: dict[str, tuple[int, list[PositionLogprobs]]]
    # Speculative steps: per row, the accepted draft tokens that come before its sampled token, and their
    # logprobs and chosen logprobs (lists in step with the tokens) where logprobs were asked for.
    accepted_drafts: list[list[int]] | None = None
    accepted_draft_logprobs: list[tuple[list[PositionLogprobs], list[float]] | None] = field(default_factory=list)


class LaunchedStep:
    """A step whose kernels are queued on the device; ``result()`` waits for its sampled tokens."""

    def __init__(
        self,
        schedule: SchedulerOutput,
        sample_rows: list[int],
        sampled_host: torch.Tensor | None,
        done: torch.cuda.Event | None,
        logprobs: list[PositionLogprobs | None] | None,
        chosen: list[float | None] | None,
        prompt_logprobs: dict[str, tuple[int, list[PositionLogprobs]]],
        host_inputs: tuple[torch.Tensor, ...] = (),
        verification: PendingVerification | None = None,
    ):
        self.schedule = schedule
        self._host_inputs = host_inputs  # pinned memory the step's kernels read in place: kept until it is done
        self._sample_rows = sample_rows
        self._sampled_host = sampled_host
        self._done = done
        self._logprobs = logprobs
        self._chosen = chosen
        self._prompt_logprobs = prompt_logprobs
        self._verification = verification  # a speculative step: its verification, maybe still on the device

    def is_ready(self) -> bool:
        """Whether ``result()`` would return without waiting for the device."""
        if self._verification is not None:
            return self._verification.is_ready()
        return self._done is None or self._done.query()

    def result(self) -> ModelRunnerOutput:
        if self._verification is not None:
            return self._verified_result(self._verification.result())
        num_rows = len(self.schedule.scheduled)
        sampled: list[int | None] = [None] * num_rows
        logprobs: list[PositionLogprobs | None] = [None] * num_rows
        chosen: list[float | None] = [None] * num_rows
        if self._sampled_host is not None:
            if self._done is not None:
                self._done.synchronize()
            tokens = self._sampled_host.tolist()
            for j, row in enumerate(self._sample_rows):
                sampled[row] = tokens[j]
                if self._logprobs is not None:
                    logprobs[row], chosen[row] = self._logprobs[j], self._chosen[j]
        return ModelRunnerOutput(sampled, logprobs, chosen, self._prompt_logprobs)

    def _verified_result(self, verification: Verification) -> ModelRunnerOutput:
        num_rows = len(self.schedule.scheduled)
        output = ModelRunnerOutput([None] * num_rows, [None] * num_rows, [None] * num_rows, self._prompt_logprobs)
        output.accepted_drafts = [[] for _ in range(num_rows)]
        output.accepted_draft_logprobs = [None] * num_rows
        for j, row in enumerate(self._sample_rows):
            *output.accepted_drafts[row], output.sampled_token_ids[row] = verification.token_ids[j]
            lps, chosen = verification.logprobs[j], verification.chosen_logprobs[j]
            if lps is not None:
                output.logprobs[row], output.chosen_logprobs[row] = lps[-1], chosen[-1]
                output.accepted_draft_logprobs[row] = (lps[:-1], chosen[:-1])
        return output


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        device: torch.device,
        block_size: int,
        attention_backend: str,
        load_format: str,
        seed: int,
        cpu_threads: int | None = None,
    ):
        if device.type == "cpu" and cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        self.model_config = model_config
        self.device = device
        self.block_size = block_size
        self.attention_backend = attention_backend
        self.model = load_model(model_config, device, load_format, attention_backend, seed)
        self.sampler = Sampler(device, seed)
        self.rejection_sampler = RejectionSampler(self.sampler, seed)
        # A draft-model proposer (spec_decode/draft_model.py): drafts a step's tokens and keeps its own KV in step.
        self.drafter = None
        self.kv_caches: list[torch.Tensor] = []
        # The last launched step's sampled ids (on the device) and each sampling request's row in them.
        self._last_sampled: torch.Tensor | None = None
        self._last_sample_rows: dict[str, int] = {}

    def weight_bytes(self) -> int:
        """Bytes of this rank's model parameters (a tied weight once)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def reseed_sampler(self, seed: int) -> None:
        self.sampler.reseed(seed)
        self.rejection_sampler.reseed(seed)

    # ---- KV cache -----------------------------------------------------------------------------------------
    def kv_cache_bytes_per_block(self) -> int:
        return self.block_size * self.model_config.kv_bytes_per_token(self.model_config.kv_dtype)

    def profile_available_kv_bytes(self, gpu_memory_utilization: float, max_num_batched_tokens: int) -> int:
        """GPU only: run a worst-case step, then give the KV cache what the memory budget leaves."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        num_blocks = -(-max_num_batched_tokens // self.block_size) + 1
        self.allocate_kv_cache(num_blocks)
        positions = torch.arange(max_num_batched_tokens, device=self.device) % self.model_config.max_model_len
        metadata = _single_sequence_metadata(max_num_batched_tokens, self.block_size, self.device)
        with torch.inference_mode(), set_forward_context(metadata):
            hidden = self.model(torch.zeros_like(positions), positions)
            if is_last_stage():  # the stage with the LM head
                self.model.compute_logits(hidden[-256:]).float().softmax(-1)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        self.kv_caches = []
        for attn in self.model.attention_layers():
            attn.kv_cache = torch.empty(0)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        activation_headroom = peak - torch.cuda.memory_allocated(self.device)
        used = total - free
        available = int(total * gpu_memory_utilization - used - activation_headroom)
        logger.info(
            "memory: total %.1f GiB, in use %.1f GiB, activation peak %.2f GiB, KV cache %.1f GiB",
            total / 2**30,
            used / 2**30,
            activation_headroom / 2**30,
            available / 2**30,
        )
        return max(available, 0)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        if num_blocks * self.block_size >= 2**31:  # slots travel as int32 (InputBuffers)
            raise ValueError(
                f"{num_blocks} KV blocks of {self.block_size} tokens exceed 2**31 cache slots: lower "
                "gpu_memory_utilization or kv_cache_memory_bytes"
            )
        cfg = self.model_config
        shape = (2, num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_size)
        self.kv_caches = [torch.zeros(shape, dtype=cfg.kv_dtype, device=self.device) for _ in range(cfg.num_layers)]
        for attn, cache in zip(self.model.attention_layers(), self.kv_caches):
            attn.kv_cache = cache

    def init_step_buffers(
        self, max_num_batched_tokens: int, max_num_seqs: int, enforce_eager: bool, num_speculative_tokens: int = 0
    ) -> None:
        """Allocate the persistent input buffers, then capture CUDA graphs where they apply: for decode steps, for
        one sequence's prefill of up to 1,024 tokens, for mixed steps of up to 2,048 tokens (packed graphs, not
        with a draft model) and, with speculation of ``k = num_speculative_tokens``, for
        verification steps of ``1 + k`` rows per sequence (the draft model's passes, and its mirror of the steps
        that mix drafts with plain rows, too)."""
        max_blocks = -(-self.model_config.max_model_len // self.block_size)
        max_tokens = max(max_num_batched_tokens, max_num_seqs)
        # One sequence more than a batch holds: a packed graph's padding rows are a sequence of their own.
        self.buffers = InputBuffers(max_tokens, max_num_seqs + 1, max_blocks, self.device)
        self.graphs = self.verify_graphs = self.mixed_graphs = None
        self.prefill_graphs: list[StepGraphs] = []  # by query length, shortest first
        # The torch reference loops on the host and FlashInfer plans each step on the host: both run eagerly.
        use_graphs = self.device.type == "cuda" and not enforce_eager and self.attention_backend == "triton"
        if use_graphs:
            self._capture_graphs(max_num_batched_tokens, max_num_seqs, max_tokens, num_speculative_tokens)
        if self.drafter is not None:
            self.drafter.init_step_buffers(max_num_seqs, self.buffers, self.verify_graphs, use_graphs)

    def _capture_graphs(
        self, max_num_batched_tokens: int, max_num_seqs: int, max_tokens: int, num_speculative_tokens: int
    ) -> None:
        """The graph sets of this model's steps, captured (their kernels compiled at once, in parallel)."""
        max_len = self.model_config.max_model_len
        self.graphs = StepGraphs(self.model, self.buffers, capture_sizes(max_num_seqs), max_len)
        self.prefill_graphs = [
            StepGraphs(self.model, self.buffers, [1], max_len, q)
            for q in prefill_query_lens(max_num_batched_tokens, max_tokens, max_len)
        ]
        tokens = mixed_graph_tokens(max_num_batched_tokens, max_tokens, max_len)
        if self.drafter is None and tokens:  # a draft model mirrors mixed steps eagerly from the packed layout
            self.mixed_graphs = PackedStepGraphs(self.model, self.buffers, tokens, max_len, max_num_seqs + 1)
        query_len = 1 + num_speculative_tokens
        sizes = verify_capture_sizes(max_num_seqs, query_len, max_tokens)
        if num_speculative_tokens and sizes:
            self.verify_graphs = StepGraphs(self.model, self.buffers, sizes, max_len, query_len)
        capture_graph_sets(
            [
                (self.graphs, "decode"),
                *[(graphs, "prefill") for graphs in reversed(self.prefill_graphs)],  # longest first: see capture
                (self.mixed_graphs, "mixed-step"),
                (self.verify_graphs, "verification"),
            ]
        )

    # ---- one step -----------------------------------------------------------------------------------------
    def _graphs_for(self, out: SchedulerOutput) -> tuple[StepGraphs | None, int]:
        """The graph set and padded batch size (a packed set: token count) that run this step, or (None, 0) to
        run it eagerly: decode steps, speculative steps whose rows all fit the verification graphs' ``1 + k``,
        one sequence's prefill of up to the longest prefill graph's tokens, other steps of up to the longest
        packed graph's tokens (each without running past ``max_model_len``, where the padding rows' block-table
        reads would end)."""
        max_query_len = max(entry.num_new_tokens for entry in out.scheduled)
        if max_query_len == 1:
            graphs = self.graphs
        elif out.spec_token_ids:
            graphs = self.verify_graphs
        else:
            graphs = None
            if len(out.scheduled) == 1:
                graphs = next((g for g in self.prefill_graphs if g.query_len >= max_query_len), None)
            if graphs is None:
                return self._packed_graphs_for(out)
        if graphs is None:
            return None, 0
        q = graphs.query_len
        if q > 1 and (max_query_len > q or any(e.start + q > graphs.max_model_len for e in out.scheduled)):
            return None, 0  # (a decode step's rows always fit: checking them would cost every step a loop)
        padded = graphs.padded_size(len(out.scheduled))
        return (graphs, padded) if padded else (None, 0)

    def _packed_graphs_for(self, out: SchedulerOutput) -> tuple[PackedStepGraphs | None, int]:
        """The packed graphs and the padded token count for a mixed step, or (None, 0) when it is longer than the
        longest."""
        graphs = self.mixed_graphs
        padded = graphs.padded_size(out.total_num_tokens) if graphs is not None else None
        return (graphs, padded) if padded else (None, 0)

    def _prepare(
        self,
        out: SchedulerOutput,
        stride: int | None,
        padded: int,
        packed_tokens: int = 0,
        drafted: DraftTokens | None = None,
    ) -> tuple[AttentionMetadata, list[int]]:
        """Fill the input buffers for this step. Rows are packed, or with ``stride`` (a graph's query length)
        each sequence owns ``stride`` rows, the ones it does not fill padding, and ``padded`` sequences in all.
        With ``packed_tokens`` (a packed graph's token count) the rows stay packed, the rows after them up to that
        count are a padding sequence of their own (a context of just themselves, no KV write: the real rows never
        see them), and empty sequences follow it up to ``padded``. ``drafted``: the draft model's drafts, which
        the step reads on the device.
        Returns the metadata and, per scheduled request, the end of its rows."""
        bs = self.block_size
        buf = self.buffers
        num_seqs = len(out.scheduled)
        num_tokens = sum(entry.num_new_tokens for entry in out.scheduled)
        max_query_len = max(entry.num_new_tokens for entry in out.scheduled)
        step = buf.begin_step(packed_tokens or (padded * stride if stride else num_tokens), padded or num_seqs)
        if stride and stride > 1:  # rows a sequence leaves empty: no KV write
            step.input_ids[:] = step.positions[:] = 0
            step.slot_mapping[:] = -1
        query_start_loc = [0]
        seq_lens: list[int] = []
        row_ends: list[int] = []
        block_width = 1
        fed = False
        for row, (request, num_new, start, _) in enumerate(out.scheduled):
            token = row * stride if stride else query_start_loc[-1]
            table = out.block_tables[request.request_id]
            buf.write_block_table_row(row, table)
            end = start + num_new
            known = min(end, request.num_tokens)  # tokens past this are still on the device (in flight)
            if num_new == 1:
                step.positions[token] = start
                step.slot_mapping[token] = table[start // bs] * bs + start % bs
            else:
                pos = np.arange(start, end)
                step.positions[token : token + num_new] = pos
                step.slot_mapping[token : token + num_new] = np.asarray(table)[pos // bs] * bs + pos % bs
            if known - start == 1:
                step.input_ids[token] = request.all_token_ids[start]
            elif known > start:
                step.input_ids[token : token + known - start] = request.all_token_ids[start:known]
            drafts = out.spec_token_ids.get(request.request_id)
            if drafts:
                if drafted is not None:  # on the device: -1 - j stands for drafted.token_ids[j]
                    drafts = [-1 - j for j in drafted.index[request.request_id]]
                step.input_ids[token + num_new - len(drafts) : token + num_new] = drafts
            elif known < end:
                assert end - known == 1, "only the last sampled token can be in flight"
                step.input_ids[token + num_new - 1] = -1 - self._last_sample_rows[request.request_id]
                fed = True
            row_ends.append(token + num_new)
            if stride:  # the padding rows after this sequence's tokens sit at its later positions
                end = start + stride
            block_width = max(block_width, -(-end // bs))
            query_start_loc.append(token + (stride or num_new))
            seq_lens.append(end)
        if packed_tokens:  # the padding sequence (its block-table row holds earlier ids: any block will do)
            pad = packed_tokens - num_tokens
            step.input_ids[num_tokens:] = 0
            step.positions[num_tokens:] = np.arange(pad)
            step.slot_mapping[num_tokens:] = -1
            block_width = max(block_width, -(-pad // bs))
            query_start_loc += [packed_tokens] * (padded - num_seqs)
            seq_lens += [pad] + [0] * (padded - num_seqs - 1)
            num_seqs = padded
        step.seq_lens[:num_seqs] = seq_lens
        step.query_start_loc[: num_seqs + 1] = query_start_loc
        if stride:
            buf.fill_padding(num_seqs * stride, num_seqs, stride)
            query_start_loc += list(range(query_start_loc[-1] + stride, padded * stride + 1, stride))
            seq_lens += [stride] * (padded - num_seqs)
        if drafted is not None:
            if fed:  # the engine launches a step with drafts only once nothing is in flight (Engine.step)
                raise RuntimeError("a step with draft-model drafts cannot also read tokens still in flight")
            buf.upload(block_width, drafted.token_ids)
        else:
            buf.upload(block_width, self._last_sampled if fed else None)
        total = query_start_loc[-1]
        metadata = buf.metadata(total, len(seq_lens), stride or max_query_len, max(seq_lens), query_start_loc, seq_lens)
        return metadata, row_ends

    def waits_at_launch(self, requests: Iterable[Request], speculative: bool) -> bool:
        """Whether :meth:`execute` may wait for the device before it returns, for a step of some of ``requests``
        (with drafts if ``speculative``): logprobs and prompt logprobs are read back there, and so is the
        verification of a batch with a sampled row (its acceptance draws read the device several times) or of
        a draft model's drafts that a penalty reads. An all-greedy verification is read back by the step's
        result."""
        requests = list(requests)
        if any(r.sampling_params.num_logprobs is not None or r.needs_prompt_logprobs for r in requests):
            return True
        return speculative and any(
            not r.sampling_params.greedy or (self.drafter is not None and r.sampling_params.needs_token_history)
            for r in requests
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, timer: StepTimer) -> LaunchedStep:
        """Launch the step: forward pass, then sampling for rows that reach the end of their sequence (prompt
        chunks short of the end do not sample). Nothing here waits for the device unless logprobs are asked."""
        drafted = self.drafter.draft(out) if self.drafter is not None and out.spec_token_ids else None
        graphs, padded = self._graphs_for(out)
        if isinstance(graphs, PackedStepGraphs):
            metadata, row_ends = self._prepare(out, None, graphs.num_seqs, packed_tokens=padded, drafted=drafted)
        else:
            metadata, row_ends = self._prepare(out, graphs.query_len if graphs else None, padded, drafted=drafted)
        timer.mark("prepare")
        on_device = self.buffers.on_device
        if graphs is not None:
            hidden = graphs.replay(padded)
        else:
            with set_forward_context(metadata):
                hidden = self.model(
                    on_device.input_ids[: metadata.num_tokens], on_device.positions[: metadata.num_tokens]
                )
        if self.drafter is not None:
            self.drafter.mirror(out, metadata, graphs if graphs is self.verify_graphs else None, padded)
        timer.mark("forward", sync=True)

        sample_rows = [i for i, entry in enumerate(out.scheduled) if entry.sample]
        sampled_host = done = logprobs = chosen = None
        host_inputs: tuple[torch.Tensor, ...] = ()
        if sample_rows and out.spec_token_ids:
            verification = self._verify(out, sample_rows, hidden, row_ends, drafted)
            prompt_logprobs = self._prompt_logprobs(out.scheduled, hidden, metadata)
            timer.mark("sample")
            return LaunchedStep(out, sample_rows, None, None, None, None, prompt_logprobs, verification=verification)
        if sample_rows:
            if len(sample_rows) == row_ends[-1]:  # pure decode: every row samples
                rows = hidden[: len(sample_rows)]
            else:
                index = [row_ends[i] - 1 for i in sample_rows]
                rows = hidden[to_device_async(index, torch.int64, self.device)]
            requests = [out.scheduled[i].request for i in sample_rows]
            result = self.sampler(self.model.compute_logits(rows), requests)
            logprobs, chosen = result.logprobs, result.chosen_logprobs
            self._last_sampled = result.token_ids
            self._last_sample_rows = {r.request_id: j for j, r in enumerate(requests)}
            host_inputs = result.host_inputs
            if self.device.type == "cpu":
                sampled_host = result.token_ids
            else:
                sampled_host = result.host_token_ids
                if sampled_host is None:
                    sampled_host = torch.empty(len(sample_rows), dtype=torch.int64, pin_memory=True)
                    sampled_host.copy_(result.token_ids, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
        prompt_logprobs = self._prompt_logprobs(out.scheduled, hidden, metadata)
        timer.mark("sample")
        return LaunchedStep(out, sample_rows, sampled_host, done, logprobs, chosen, prompt_logprobs, host_inputs)

    def _verify(
        self,
        out: SchedulerOutput,
        sample_rows: list[int],
        hidden: torch.Tensor,
        row_ends: list[int],
        drafted: DraftTokens | None,
    ) -> PendingVerification:
        """A step with drafts: logits at each sampling row's last token and at each of its drafts, checked by the
        rejection sampler (rows without drafts just sample; ``drafted``: a draft model's drafts, on the device,
        and the distributions it drew them from; ``row_ends``: where each row's tokens end in ``hidden``). The
        step's result reads the tokens back: the next step's inputs depend on how many drafts were accepted."""
        requests = [out.scheduled[i].request for i in sample_rows]
        drafts = [out.spec_token_ids.get(r.request_id, []) for r in requests]
        index = []
        for i, d in zip(sample_rows, drafts):
            index.extend(range(row_ends[i] - 1 - len(d), row_ends[i]))
        logits = self.model.compute_logits(hidden[to_device_async(index, torch.int64, self.device)])
        self._last_sampled, self._last_sample_rows = None, {}
        if drafted is None:
            return self.rejection_sampler(logits, requests, drafts)
        where = [j for r in requests for j in drafted.index.get(r.request_id, ())]
        on_device = drafted.token_ids[to_device_async(where, torch.int64, self.device)]
        draft_probs = [drafted.probs.get(r.request_id) for r in requests]
        return self.rejection_sampler(logits, requests, drafts, draft_probs, on_device)

    def _prompt_logprobs(
        self, scheduled: list[ScheduledRequest], hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> dict[str, tuple[int, list[PositionLogprobs]]]:
        """Logprob of each prompt token given the tokens before it, for requests that asked for them."""
        result: dict[str, tuple[int, list[PositionLogprobs]]] = {}
        for i, (request, num_new, start, _) in enumerate(scheduled):
            k = request.sampling_params.prompt_logprobs
            if k is None:
                continue
            # Position p predicts token p + 1; keep predictions of prompt tokens not recorded yet.
            first = max(start, len(request.prompt_logprobs) - 1)
            last = min(start + num_new, request.num_prompt_tokens - 1)
            if first >= last:
                continue
            q0 = metadata.query_start_loc_cpu[i] - start
            positions: list[PositionLogprobs] = []
            # A slice of rows at a time: a whole 2,048-token chunk's float32 log-softmax over a 151k vocabulary
            # would take 1.2 GB at once.
            for lo in range(first, last, PROMPT_LOGPROBS_ROWS):
                hi = min(lo + PROMPT_LOGPROBS_ROWS, last)
                lps = self.model.compute_logits(hidden[q0 + lo : q0 + hi]).float().log_softmax(dim=-1)
                positions += prompt_position_logprobs(lps, request.prompt_token_ids[lo + 1 : hi + 1], k)
            result[request.request_id] = (first + 1, positions)
        return result


def _single_sequence_metadata(num_tokens: int, block_size: int, device: torch.device) -> AttentionMetadata:
    """Metadata of one sequence of ``num_tokens`` prompt tokens in blocks 0..n (used for memory profiling)."""
    num_blocks = -(-num_tokens // block_size)
    return AttentionMetadata(
        num_tokens=num_tokens,
        num_seqs=1,
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        slot_mapping=torch.arange(num_tokens, dtype=torch.int64, device=device),
        query_start_loc_cpu=[0, num_tokens],
        seq_lens_cpu=[num_tokens],
    )
