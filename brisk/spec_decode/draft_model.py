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
target distribution. The draft runs eagerly (no CUDA graphs yet).
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

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Placeholders: reserve slots for ``min(k, max_tokens)`` drafts; :meth:`draft` writes the tokens once
        the step is scheduled (the draft's passes need the slots)."""
        return [0] * min(self.num_speculative_tokens, max_tokens)

    @torch.inference_mode()
    def draft(self, out: SchedulerOutput) -> dict[str, torch.Tensor]:
        """Replace the step's placeholder drafts by the draft model's continuation, in place. Returns, for each
        sampled (not greedy) request, the ``[d, vocab]`` distributions its drafts were drawn from."""
        bs = self.block_size
        rows = [e for e in out.scheduled if e.request.request_id in out.spec_token_ids]
        drafts = [out.spec_token_ids[e.request.request_id] for e in rows]
        previous = [e.request.all_token_ids[e.start] for e in rows]  # the last known token
        q: list[list[torch.Tensor]] = [[] for _ in rows]
        for j in range(max(len(d) for d in drafts)):
            active = [i for i, d in enumerate(drafts) if len(d) > j]
            positions = [rows[i].start + j for i in active]
            tables = [out.block_tables[rows[i].request.request_id] for i in active]
            slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, positions)]
            seq_lens = [p + 1 for p in positions]
            width = -(-max(seq_lens) // bs)
            table = torch.tensor([(t[:width] + [0] * width)[:width] for t in tables], dtype=torch.int32)
            n = len(active)
            metadata = AttentionMetadata(
                num_tokens=n,
                num_seqs=n,
                max_query_len=1,
                max_seq_len=max(seq_lens),
                query_start_loc=to_device_async(list(range(n + 1)), torch.int32, self.device),
                seq_lens=to_device_async(seq_lens, torch.int32, self.device),
                block_tables=table.to(self.device),
                slot_mapping=to_device_async(slots, torch.int64, self.device),
                query_start_loc_cpu=list(range(n + 1)),
                seq_lens_cpu=seq_lens,
            )
            ids = to_device_async([previous[i] for i in active], torch.int64, self.device)
            with set_forward_context(metadata):
                hidden = self.runner.model(ids, to_device_async(positions, torch.int64, self.device))
            logits = self.runner.model.compute_logits(hidden)
            tokens = self._choose(logits, [rows[i].request for i in active], q, active)
            for i, token in zip(active, tokens):
                drafts[i][j] = previous[i] = token
        return {e.request.request_id: torch.stack(qi) for e, qi in zip(rows, q) if qi}

    def _choose(self, logits: torch.Tensor, requests, q: list[list[torch.Tensor]], active: list[int]) -> list[int]:
        """The argmax for greedy requests; for sampled ones a draw from the filtered distribution, recorded in q."""
        greedy = [r.sampling_params.greedy for r in requests]
        argmax = logits.argmax(dim=-1)
        if all(greedy):
            return argmax.tolist()
        sampler = self.runner.sampler
        probs = sampler.filtered_probs(logits.float(), requests, greedy)
        drawn = sampler.draw(probs, requests, greedy)
        for row, (i, g) in enumerate(zip(active, greedy)):
            if not g:
                q[i].append(probs[row])
        return torch.where(to_device_async(greedy, torch.bool, self.device), argmax, drawn).tolist()

    @torch.inference_mode()
    def mirror(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> None:
        """Write the draft's KV of a target step's tokens (the step's own inputs and slots)."""
        with set_forward_context(metadata):
            self.runner.model(input_ids, positions)
