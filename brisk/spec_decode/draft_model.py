"""The draft-model proposer: a small model with the target's vocabulary guesses the next tokens.

The draft has its own paged KV cache with as many blocks as the target's, addressed by the *same* block tables and
slots: one block manager and one memory plan serve both (each block costs the target's bytes plus the draft's), so
prefix-cache hits, chunked prefill, preemption and rollback need nothing of their own: a slot holds the draft's KV
of the token the target's KV in it belongs to.

A step with drafts runs in this order: the scheduler reserves ``1 + d`` slots for a decoding request (``d``
placeholder drafts from :meth:`propose`), :meth:`draft` computes the ``d`` tokens by ``d`` batched draft passes, and
the target verifies them. The drafts stay on the device: the target's step reads them there and, where no row's
sampling reads its token history, the host sees them with the verification's tokens in one read a step; the host
does not wait for the device between the passes but for each pass's read of its inputs. The drafting passes write
the draft's KV of every position they feed (the step's first token to its last draft but one), and accepted drafts
keep theirs; the one position they never feed is the last draft's, whose KV is missing when every draft was
accepted: then the first pass feeds two tokens per sequence, the one before the last known token and that token
(writing the missing KV, re-writing the others'), else one. A step where every sequence has drafts therefore needs
nothing more. Other steps (prompts, plain decodes) run the draft over the step's own tokens, slots and positions
("mirroring", :meth:`mirror`), first catching up sequences whose last verification accepted all their drafts and
that now decode without drafts. One case stays behind: a request that ends, is aborted or is preempted right after
such a step leaves its last draft's position without draft KV, and a later prompt that hits that block in the prefix
cache (the next turn of a chat) drafts over one stale entry there. That costs acceptance, never the target's tokens.

The drafts are the draft's argmax (``draft_sample_method="greedy"``, the default): the rejection sampler takes them as
a point mass, as it takes n-gram drafts (accept with probability ``p(t)``, else draw from ``p`` without ``t``). With
``"probabilistic"`` a sampled request's drafts are drawn from the draft's distribution under the request's
temperature, top-k, top-p and min-p, and that distribution ``q`` goes to the rejection sampler (accept with
``min(1, p/q)``, else draw from ``max(0, p - q)``). Both keep the target distribution.

On a GPU the passes replay CUDA graphs: the drafting passes are steps over the draft's own input buffers (one or two
tokens a sequence, then one), each feeding the previous pass's tokens on the device, and the mirror replays the
draft model over the target's input buffers in the shape the target's verification graph ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from brisk.config import ModelConfig, read_hf_config
from brisk.device_transfer import to_device_async
from brisk.engine.request import Request
from brisk.engine.scheduler import SchedulerOutput
from brisk.forward_context import set_forward_context
from brisk.layers.attention.backend import AttentionMetadata
from brisk.layers.quantization import get_quantization_config
from brisk.spec_decode.config import SpeculativeConfig
from brisk.worker.cuda_graphs import MAX_VERIFY_GRAPH_SEQS, StepGraphs, capture_graph_sets, capture_sizes
from brisk.worker.input_buffers import InputBuffers
from brisk.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class DraftTokens:
    """A step's drafts from the draft model, on the device. ``token_ids``: every drafting pass's tokens, one after
    the other; ``index``: per request, where its drafts sit in them, in order; ``probs``: per sampled (not greedy)
    request, the ``[d, vocab]`` distributions its drafts were drawn from."""

    token_ids: torch.Tensor
    index: dict[str, list[int]]
    probs: dict[str, torch.Tensor]


def draft_model_config(config: SpeculativeConfig, target: ModelConfig) -> ModelConfig:
    """The draft's config at the target's dtype and max_model_len, its weights held as its checkpoint's
    ``quantization_config`` or ``config.quantization`` says; a clear error when it cannot serve as a draft."""
    from brisk.loader.resolve import resolve_model

    draft = config.model
    if config.max_model_len is not None and config.max_model_len < target.max_model_len:
        raise ValueError(
            f"speculative_config['max_model_len']={config.max_model_len} is below max_model_len "
            f"({target.max_model_len}): brisk's draft proposes at every position. Leave it out, or lower max_model_len."
        )
    path = resolve_model(draft, target.dtype, revision=config.revision)
    hf_config = read_hf_config(path, target.trust_remote_code)
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
    draft_config = ModelConfig.from_hf_config(path, hf_config, target.dtype, target.max_model_len)
    try:
        draft_config.quant_config = get_quantization_config(config.quantization, hf_config)
    except ValueError as exc:
        raise ValueError(f"speculative_config['quantization'] for the draft {draft!r}: {exc}") from exc
    draft_config.trust_remote_code = target.trust_remote_code
    return draft_config


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
        self.samples_drafts = config.draft_sample_method == "probabilistic"
        self.block_size = block_size
        self.device = device
        self.runner = ModelRunner(
            draft_model_config(config, target), device, block_size, attention_backend, load_format, seed
        )

    def kv_cache_bytes_per_block(self) -> int:
        return self.runner.kv_cache_bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    def init_step_buffers(
        self, max_num_seqs: int, target_buffers: InputBuffers, verify_graphs: StepGraphs | None, use_graphs: bool
    ) -> None:
        """The drafting passes' input buffers; with ``use_graphs``, their graphs (one token a sequence, and two for
        a first pass that fills a missing position) and, beside the target's ``verify_graphs``, the mirror's graphs
        of the same sizes over the target's buffers."""
        max_len = self.runner.model_config.max_model_len
        max_blocks = -(-max_len // self.block_size)
        self.buffers = InputBuffers(2 * max_num_seqs, max_num_seqs, max_blocks, self.device)
        self.mirror_inputs = target_buffers.on_device
        # Requests whose last step ran without a mirror, with the position of their last draft: its draft KV is
        # missing if all drafts were accepted (then it is the position before the next step's first).
        self._unmirrored: dict[str, tuple[Request, int]] = {}
        self.graphs = self.first_pass_graphs = self.mirror_graphs = None
        if not use_graphs:
            return
        sizes = [s for s in capture_sizes(max_num_seqs) if s <= MAX_VERIFY_GRAPH_SEQS]
        self.first_pass_graphs = StepGraphs(self.runner.model, self.buffers, sizes, max_len, query_len=2)
        self.graphs = StepGraphs(self.runner.model, self.buffers, sizes, max_len)
        if verify_graphs is not None:
            q = verify_graphs.query_len
            self.mirror_graphs = StepGraphs(self.runner.model, target_buffers, verify_graphs.sizes, max_len, q)
        capture_graph_sets(
            [(self.first_pass_graphs, "first draft pass"), (self.graphs, "draft"), (self.mirror_graphs, "draft mirror")]
        )

    def propose(self, request: Request, max_tokens: int) -> list[int]:
        """Placeholders: reserve slots for ``min(k, max_tokens)`` drafts; :meth:`draft` writes the tokens once
        the step is scheduled (the draft's passes need the slots)."""
        return [0] * min(self.num_speculative_tokens, max_tokens)

    def may_propose(self, request: Request) -> bool:
        """A draft model always has a guess."""
        return True

    @torch.inference_mode()
    def draft(self, out: SchedulerOutput) -> DraftTokens:
        """The draft model's continuation of each request with placeholder drafts in ``out``, left on the device:
        the target's step reads them there, and the host sees them with the verification's tokens, so it does not
        wait for the drafts before it prepares and launches the target's pass."""
        rows = [e for e in out.scheduled if e.request.request_id in out.spec_token_ids]
        counts = [len(out.spec_token_ids[e.request.request_id]) for e in rows]
        q: list[list[torch.Tensor]] = [[] for _ in rows]
        index: list[list[int]] = [[] for _ in rows]  # where each row's drafts sit in the passes' tokens
        passes: list[torch.Tensor] = []  # each pass's tokens, on the device
        previous_row: dict[int, int] = {}  # a row's index in the last pass's tokens
        offset = 0
        for j in range(max(counts)):
            active = [i for i, c in enumerate(counts) if c > j]
            feeds = []
            # The first pass starts from the last known token, after the one before it where a sequence lacks
            # that one's KV (its last step accepted every draft): then every sequence feeds two tokens.
            two = j == 0 and any(self._lacks_previous(rows[i]) for i in active)
            for i in active:
                entry = rows[i]
                table = out.block_tables[entry.request.request_id]
                s = entry.start
                if two:
                    feeds.append((entry.request.all_token_ids[s - 1 : s + 1], [s - 1, s], table))
                elif j == 0:
                    feeds.append(([entry.request.all_token_ids[s]], [s], table))
                else:  # the previous pass's draft, still on the device
                    feeds.append(([-1 - previous_row[i]], [s + j], table))
            hidden = self._run(feeds, self.first_pass_graphs if two else self.graphs, passes[-1] if passes else None)
            logits = self.runner.model.compute_logits(hidden)
            passes.append(self._choose(logits, [rows[i].request for i in active], q, active))
            previous_row = {i: row for row, i in enumerate(active)}
            for row, i in enumerate(active):
                index[i].append(offset + row)
            offset += len(active)
        return DraftTokens(
            torch.cat(passes),
            {e.request.request_id: ix for e, ix in zip(rows, index)},
            {e.request.request_id: torch.stack(qi) for e, qi in zip(rows, q) if qi},
        )

    def _lacks_previous(self, entry) -> bool:
        """Whether the draft's KV before the scheduled request's first token is missing: its last step ran no
        mirror and that position held its last draft, which no pass feeds (all its drafts were accepted)."""
        lagging = self._unmirrored.get(entry.request.request_id)
        return lagging is not None and lagging[1] == entry.start - 1

    def _run(
        self,
        feeds: list[tuple[list[int], list[int], list[int]]],
        graphs: StepGraphs | None,
        previous: torch.Tensor | None,
    ) -> torch.Tensor:
        """One pass of the draft over its own buffers, the same number of tokens for each sequence: per sequence
        its input ids (``-1 - j``: row ``j`` of ``previous``, on the device), positions and block table. Writes
        their KV; returns the hidden state of each sequence's last token. Replays ``graphs`` where a size fits."""
        bs, buf = self.block_size, self.buffers
        n, q = len(feeds), len(feeds[0][1])
        padded = (graphs.padded_size(n) or 0) if graphs is not None else 0
        step = buf.begin_step((padded or n) * q, padded or n)
        seq_lens: list[int] = []
        width = 1
        for row, (ids, positions, table) in enumerate(feeds):
            buf.write_block_table_row(row, table)
            t = row * q
            step.input_ids[t : t + q] = ids
            step.positions[t : t + q] = positions
            step.slot_mapping[t : t + q] = [table[p // bs] * bs + p % bs for p in positions]
            seq_lens.append(positions[-1] + 1)
            width = max(width, -(-seq_lens[-1] // bs))
        step.seq_lens[:n] = seq_lens
        query_start_loc = list(range(0, n * q + 1, q))
        step.query_start_loc[: n + 1] = query_start_loc
        if padded:
            buf.fill_padding(n * q, n, q)
        buf.upload(width, previous)
        if padded:
            hidden = graphs.replay(padded)
        else:
            metadata = buf.metadata(n * q, n, q, max(seq_lens), query_start_loc, seq_lens)
            with set_forward_context(metadata):
                hidden = self.runner.model(buf.on_device.input_ids[: n * q], buf.on_device.positions[: n * q])
        return hidden[q - 1 : n * q : q]

    def _choose(self, logits: torch.Tensor, requests, q: list[list[torch.Tensor]], active: list[int]) -> torch.Tensor:
        """The argmax; with probabilistic drafting, for sampled requests a draw from the filtered distribution,
        recorded in q (the tokens stay on the device)."""
        greedy = [r.sampling_params.greedy for r in requests]
        argmax = logits.argmax(dim=-1)
        if all(greedy) or not self.samples_drafts:
            return argmax
        sampler = self.runner.sampler
        probs = sampler.filtered_probs(logits.float(), requests, greedy)
        drawn = sampler.draw(probs, requests, greedy)
        for row, (i, g) in enumerate(zip(active, greedy)):
            if not g:
                q[i].append(probs[row])
        return torch.where(to_device_async(greedy, torch.bool, self.device), argmax, drawn)

    @torch.inference_mode()
    def mirror(
        self, out: SchedulerOutput, metadata: AttentionMetadata, verify_graphs: StepGraphs | None, padded: int
    ) -> None:
        """Write the draft's KV of a target step's tokens (its inputs and slots, in the target's input buffers),
        unless every sequence of the step had drafts: their passes wrote it. ``verify_graphs``: the target's
        verification graphs when one of them ran the step at ``padded`` sequences; the draft then replays its
        graph of that size."""
        unmirrored = {k: v for k, v in self._unmirrored.items() if not v[0].is_finished}
        if len(out.spec_token_ids) == len(out.scheduled):
            for entry in out.scheduled:
                request = entry.request
                unmirrored[request.request_id] = (request, entry.start + len(out.spec_token_ids[request.request_id]))
            self._unmirrored = unmirrored
            return
        behind = []  # decoding without drafts now, after a step whose drafts were all accepted
        for entry in out.scheduled:
            request = entry.request
            lagging = unmirrored.pop(request.request_id, None)
            if lagging is not None and lagging[1] == entry.start - 1 and request.request_id not in out.spec_token_ids:
                table = out.block_tables[request.request_id]
                behind.append(([request.all_token_ids[lagging[1]]], [lagging[1]], table))
        self._unmirrored = unmirrored
        if behind:
            self._run(behind, self.graphs, None)
        if verify_graphs is not None and self.mirror_graphs is not None:
            self.mirror_graphs.replay(padded)
            return
        on_device = self.mirror_inputs
        with set_forward_context(metadata):
            self.runner.model(on_device.input_ids[: metadata.num_tokens], on_device.positions[: metadata.num_tokens])
