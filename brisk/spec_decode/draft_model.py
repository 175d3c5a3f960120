"""The draft-model proposer: a small model with the target's vocabulary guesses the next tokens.

The draft has its own paged KV cache with as many blocks as the target's, addressed by the *same* block tables
and slots: one block manager and one memory plan serve both (each block costs the target's bytes plus the
draft's). Its cache is kept in step with the target's by running the draft over every step's tokens
("mirroring": same input ids, positions and slots), so prefix-cache hits, chunked prefill, preemption and
rollback need nothing of their own: a slot is valid for the draft exactly when it is for the target.

A step with drafts runs in this order: the scheduler reserves ``1 + d`` slots for a decoding request (``d``
placeholder drafts from :meth:`propose`), :meth:`draft` fills in the ``d`` tokens by ``d`` batched single-token
draft passes that write those slots, the target verifies them, and :meth:`mirror` writes the draft's KV of the
step's tokens. For greedy requests the drafts are the draft's argmax; for sampled ones they are drawn from the
draft's distribution under the request's temperature, top-k, top-p and min-p, and that distribution ``q`` goes
to the rejection sampler (accept with ``min(1, p/q)``, else draw from ``max(0, p - q)``), which keeps the
target distribution.

On a GPU both kinds of pass replay CUDA graphs: the drafting passes are decode steps over the draft's own input
buffers, each feeding the previous pass's tokens on the device (the host reads all drafts once, after the last
pass), and the mirror replays the draft model over the target's input buffers in the shape the target's
verification graph ran.
"""

from __future__ import annotations

import logging

import torch

from brisk.config import ModelConfig, read_hf_config
from brisk.device_transfer import to_device_async
from brisk.engine.scheduler import SchedulerOutput
from brisk.forward_context import set_forward_context
from brisk.layers.attention.backend import AttentionMetadata
from brisk.spec_decode.config import SpeculativeConfig
from brisk.worker.cuda_graphs import MAX_VERIFY_GRAPH_SEQS, StepGraphs, capture_sizes
from brisk.worker.input_buffers import InputBuffers
from brisk.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def draft_model_config(draft: str, target: ModelConfig) -> ModelConfig:
    """The draft's config at the target's dtype and max_model_len; a clear error when it cannot serve as one."""
    from brisk.loader.resolve import resolve_model

    path = resolve_model(draft, target.dtype)
    hf_config = read_hf_config(path)
    text_config = getattr(hf_config, "text_config", None) or hf_config
    draft_vocab, target_vocab = text_config.vocab_size, target.hf_config.vocab_size
    if draft_vocab != target_vocab:
        raise ValueError(
            f"The draft model {draft!r} has a vocabulary of {draft_vocab} tokens, the target {target_vocab}: a "
            "draft must share the target's tokenizer. Choose a draft from the target's family."
        )
    positions = getattr(text_config, "max_position_embeddings", None) or 2048
    if positions < target.max_model_len:
        raise ValueError(
            f"The draft model {draft!r} allows {positions} positions but max_model_len is {target.max_model_len}: "
            f"lower max_model_len to at most {positions}, or choose a draft with a longer context."
        )
    return ModelConfig.from_hf_config(path, hf_config, target.dtype, target.max_model_len)


class DraftModelProposer:
    def __init__(
        self,
        config: SpeculativeConfig,
        target: ModelConfig,
        device: torch.device,
        block_size: int,
        attention_backend: str,
        load_format: str,
        seed: int,
    ):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.block_size = block_size
        self.device = device
        self.runner = ModelRunner(
            draft_model_config(config.model, target), device, block_size, attention_backend, load_format, seed
        )

    def kv_cache_bytes_per_block(self) -> int:
        return self.runner.kv_cache_bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    def init_step_buffers(
        self, max_num_seqs: int, target_buffers: InputBuffers, verify_graphs: StepGraphs | None, use_graphs: bool
    ) -> None:
        """The drafting passes' input buffers; with ``use_graphs``, their decode graphs and, beside the target's
        ``verify_graphs``, the mirror's graphs of the same sizes over the target's buffers."""
        max_len = self.runner.model_config.max_model_len
        max_blocks = -(-max_len // self.block_size)
        self.buffers = InputBuffers(max_num_seqs, max_num_seqs, max_blocks, self.device)
        self.mirror_inputs = target_buffers.on_device
        self.graphs = self.mirror_graphs = None
        if not use_graphs:
            return
        sizes = [s for s in capture_sizes(max_num_seqs) if s <= MAX_VERIFY_GRAPH_SEQS]
        self.graphs = StepGraphs(self.runner.model, self.buffers, sizes, max_len)
        pool = self.graphs.capture(what="draft")
        if verify_graphs is not None:
            q = verify_graphs.query_len
            self.mirror_graphs = StepGraphs(self.runner.model, target_buffers, verify_graphs.sizes, max_len, q)
            self.mirror_graphs.capture(pool, "draft mirror")

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Placeholders: reserve slots for ``min(k, max_tokens)`` drafts; :meth:`draft` writes the tokens once
        the step is scheduled (the draft's passes need the slots)."""
        return [0] * min(self.num_speculative_tokens, max_tokens)

    @torch.inference_mode()
    def draft(self, out: SchedulerOutput) -> dict[str, torch.Tensor]:
        """Replace the step's placeholder drafts by the draft model's continuation, in place. Returns, for each
        sampled (not greedy) request, the ``[d, vocab]`` distributions its drafts were drawn from."""
        bs, buf = self.block_size, self.buffers
        rows = [e for e in out.scheduled if e.request.request_id in out.spec_token_ids]
        drafts = [out.spec_token_ids[e.request.request_id] for e in rows]
        q: list[list[torch.Tensor]] = [[] for _ in rows]
        passes: list[tuple[list[int], torch.Tensor]] = []  # per pass: the rows it drafted for, their tokens
        previous: torch.Tensor | None = None  # the last pass's tokens, on the device
        previous_row: dict[int, int] = {}  # a row's index in them
        for j in range(max(len(d) for d in drafts)):
            active = [i for i, d in enumerate(drafts) if len(d) > j]
            n = len(active)
            padded = (self.graphs.padded_size(n) or 0) if self.graphs is not None else 0
            step = buf.begin_step(padded or n, padded or n)
            seq_lens: list[int] = []
            width = 1
            for row, i in enumerate(active):
                entry = rows[i]
                position = entry.start + j
                table = out.block_tables[entry.request.request_id]
                buf.write_block_table_row(row, table)
                # The first pass starts from the last known token; later ones from the previous pass's draft.
                step.input_ids[row] = entry.request.all_token_ids[entry.start] if j == 0 else -1 - previous_row[i]
                step.positions[row] = position
                step.slot_mapping[row] = table[position // bs] * bs + position % bs
                seq_lens.append(position + 1)
                width = max(width, -(-(position + 1) // bs))
            step.seq_lens[:n] = seq_lens
            step.query_start_loc[: n + 1] = range(n + 1)
            if padded:
                buf.fill_padding(n, n)
            buf.upload(width, previous)
            if padded:
                hidden = self.graphs.replay(padded)[:n]
            else:
                metadata = buf.metadata(n, n, 1, max(seq_lens), list(range(n + 1)), seq_lens)
                with set_forward_context(metadata):
                    hidden = self.runner.model(buf.on_device.input_ids[:n], buf.on_device.positions[:n])
            logits = self.runner.model.compute_logits(hidden)
            previous = self._choose(logits, [rows[i].request for i in active], q, active)
            previous_row = {i: row for row, i in enumerate(active)}
            passes.append((active, previous))
        tokens = torch.cat([t for _, t in passes]).tolist()  # the one wait for the device
        offset = 0
        for j, (active, _) in enumerate(passes):
            for row, i in enumerate(active):
                drafts[i][j] = tokens[offset + row]
            offset += len(active)
        return {e.request.request_id: torch.stack(qi) for e, qi in zip(rows, q) if qi}

    def _choose(
        self, logits: torch.Tensor, requests, q: list[list[torch.Tensor]], active: list[int]
    ) -> torch.Tensor:
        """The argmax for greedy requests; for sampled ones a draw from the filtered distribution, recorded in q
        (the tokens stay on the device)."""
        greedy = [r.sampling_params.greedy for r in requests]
        argmax = logits.argmax(dim=-1)
        if all(greedy):
            return argmax
        sampler = self.runner.sampler
        probs = sampler.filtered_probs(logits.float(), requests, greedy)
        drawn = sampler.draw(probs, requests, greedy)
        for row, (i, g) in enumerate(zip(active, greedy)):
            if not g:
                q[i].append(probs[row])
        return torch.where(to_device_async(greedy, torch.bool, self.device), argmax, drawn)

    @torch.inference_mode()
    def mirror(self, metadata: AttentionMetadata, verify_graphs: StepGraphs | None, padded: int) -> None:
        """Write the draft's KV of a target step's tokens: the step's own inputs and slots, in the target's input
        buffers. ``verify_graphs``: the target's verification graphs when one of them ran the step at ``padded``
        sequences; the draft then replays its graph of that size."""
        if verify_graphs is not None and self.mirror_graphs is not None:
            self.mirror_graphs.replay(padded)
            return
        on_device = self.mirror_inputs
        with set_forward_context(metadata):
            self.runner.model(on_device.input_ids[: metadata.num_tokens], on_device.positions[: metadata.num_tokens])
