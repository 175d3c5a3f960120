"""CUDA graphs for steps of a fixed shape: one graph per padded batch size, captured at startup.

A decode step of a small batch is dominated by kernel launches; replaying a captured graph launches the whole
forward pass at once. The graphs read the persistent input buffers, so a replay only needs those filled.

A graph set has a query length ``Q``: each sequence owns ``Q`` consecutive token rows. ``Q = 1`` is plain
decoding. ``Q = 1 + k`` serves speculative verification, where a sequence feeds its last token and up to ``k``
drafts; rows it does not fill are padding (no KV write, outputs ignored). A lone sequence's prompt (or chunk) of
up to ``Q`` tokens replays a one-sequence graph of the next prefill length: a request arriving at an idle engine
gets its first token without hundreds of kernel launches. Attention metadata is captured with
``max_seq_len = max_model_len``: the decode kernel sizes its grid from that bound, the unified kernel from the
token and sequence counts, and both find each sequence's real length on the device.

Steps that mix several sequences' prompt chunks with decodes (a serving batch while requests arrive) replay a
*packed* graph (``PackedStepGraphs``) of the next token count: the rows stay packed as in an eager step, the rows
past the real ones are a padding sequence of their own (no KV write, and no real row attends to them), and empty
sequences fill the count up to ``max_num_seqs + 1``, so one graph per token count serves any mix. Under 2,048
tokens such a step of an 8B model is launch-bound: 30 to 50 ms launched from the host, against 16 ms for a graphed
decode of 256 sequences (the step timeline of W5 at 256 streams on an H200).
"""

from __future__ import annotations

import bisect
import logging
import time

import numpy as np
import torch

from brisk.forward_context import set_forward_context
from brisk.worker.input_buffers import InputBuffers
from brisk.worker.parallel_compiles import DeferredCompiles

logger = logging.getLogger(__name__)

# Speculative verification graphs go up to this many sequences: above it a step of 1 + k tokens per sequence is
# no longer launch-bound, and speculation seldom pays there (docs/speculative-decoding.md).
MAX_VERIFY_GRAPH_SEQS = 64


# One-sequence prefill graphs are captured at these query lengths. Below 1,024 tokens a prefill of an 8B model
# is host-bound (a 128-token prompt: 328 kernels, 5.3 ms on an H200's GPU, about 19 ms of launches on its host).
PREFILL_GRAPH_QUERY_LENS = (16, 32, 64, 128, 256, 512, 1024)


# Packed (mixed-step) graphs are captured at these token counts; above them a step is compute-bound. Steps of
# 1,025 to 1,088 tokens (a 1,024-token prompt beside up to 64 decodes, as in W5) are common: padded to 1,536 they
# did up to 48% more GEMM work, hence 1,152 and 1,280. (W5 c=16's ITL p99 moved from 16.9 to 28.9 ms on an H200
# with them, but its mean only 2.6% from vLLM's: that p99 sits on the edge of the ~1% of gaps that wait for a
# prefill step; docs/benchmarks.md, seventeenth run.)
MIXED_GRAPH_TOKENS = (64, 128, 192, 256, 384, 512, 768, 1024, 1152, 1280, 1536, 1792, 2048)


def _lengths_within(candidates: tuple[int, ...], max_num_batched_tokens: int, max_tokens: int, max_model_len: int):
    """The candidate row counts that fit the input buffers (``max_tokens`` rows) and the context, up to the first
    that holds a whole step's budget: a longer graph would never be replayed."""
    lens = [q for q in candidates if q <= min(max_tokens, max_model_len)]
    needed = [q for q in lens if q < max_num_batched_tokens]
    return lens[: len(needed) + 1]


def prefill_query_lens(max_num_batched_tokens: int, max_tokens: int, max_model_len: int) -> list[int]:
    """Query lengths of the one-sequence prefill graphs."""
    return _lengths_within(PREFILL_GRAPH_QUERY_LENS, max_num_batched_tokens, max_tokens, max_model_len)


def mixed_graph_tokens(max_num_batched_tokens: int, max_tokens: int, max_model_len: int) -> list[int]:
    """Token counts of the packed graphs for mixed steps."""
    return _lengths_within(MIXED_GRAPH_TOKENS, max_num_batched_tokens, max_tokens, max_model_len)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs]
    sizes += list(range(8, max_num_seqs + 1, 8))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def verify_capture_sizes(max_num_seqs: int, query_len: int, max_tokens: int) -> list[int]:
    """Batch sizes of the verification graphs: those of decoding, up to ``MAX_VERIFY_GRAPH_SEQS`` sequences
    whose ``query_len`` rows each fit the input buffers."""
    limit = min(MAX_VERIFY_GRAPH_SEQS, max_num_seqs, max_tokens // query_len)
    return [s for s in capture_sizes(max_num_seqs) if s <= limit]


def capture_graph_sets(graph_sets: list[tuple[StepGraphs | None, str]], pool=None):
    """Capture each ``(graphs, what)`` set in order (``None`` skipped), the sets sharing one memory pool, which is
    returned. First every size of every set runs once, eagerly, with its Triton kernels recorded, and those are
    compiled at once, in parallel: that pass is also each size's warm-up (lazy initialization) before capture."""
    present = [(graphs, what) for graphs, what in graph_sets if graphs is not None]
    with DeferredCompiles() as compiles:
        for graphs, _ in present:
            graphs.record_compiles(compiles)
    for graphs, what in present:
        pool = graphs.capture(pool, what)
    return pool


class StepGraphs:
    """Graphs of one model over one set of input buffers, for steps of ``query_len`` rows per sequence."""

    def __init__(
        self,
        model: torch.nn.Module,
        buffers: InputBuffers,
        sizes: list[int],
        max_model_len: int,
        query_len: int = 1,
    ):
        self.model = model
        self.buffers = buffers
        self.max_model_len = max_model_len
        self.query_len = query_len
        self.sizes = sizes
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def padded_size(self, num_seqs: int) -> int | None:
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def _metadata(self, size: int):
        q = self.query_len
        qsl = list(range(0, size * q + 1, q))
        return self.buffers.metadata(size * q, size, q, self.max_model_len, qsl, [q] * size, for_graph=True)

    def _rows(self, size: int) -> int:
        return size * self.query_len

    def _stage(self, size: int) -> None:
        """Fill the device buffers with a harmless step of ``size`` (padding rows only) to capture it on."""
        self.buffers.begin_step(size * self.query_len, size)
        self.buffers.fill_padding(0, 0, self.query_len)
        self.buffers.clear_block_table()
        self.buffers.upload(block_width=1, sampled=None)

    def _inputs(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._rows(size)
        return self.buffers.on_device.input_ids[:rows], self.buffers.on_device.positions[:rows]

    @torch.inference_mode()
    def record_compiles(self, compiles: DeferredCompiles) -> None:
        """Run each size's forward pass eagerly, its uncompiled Triton kernels only recorded into ``compiles``
        (they can all be compiled at once before ``capture``) and the rest of it run."""
        for size in self.sizes:
            self._stage(size)
            with compiles.recording(), set_forward_context(self._metadata(size)):
                self.model(*self._inputs(size))

    @torch.inference_mode()
    def capture(self, pool=None, what: str = "decode"):
        """Capture every size (largest first, so smaller graphs reuse its memory); returns the memory pool, which
        another graph set may share. Every kernel must be compiled by now (``capture_graph_sets``): a compile
        inside a capture would load its module there."""
        start = time.perf_counter()
        stream = torch.cuda.Stream()
        for size in reversed(self.sizes):
            self._stage(size)
            with set_forward_context(self._metadata(size)):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[size] = self.model(*self._inputs(size))
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info(
            "captured %d %s CUDA graphs (%s) in %.1f s", len(self.graphs), what, self._describe(),
            time.perf_counter() - start,
        )  # fmt: skip
        return pool

    def _describe(self) -> str:
        return f"{self.query_len} tokens per sequence"

    def replay(self, size: int) -> torch.Tensor:
        """The hidden states of all ``size * query_len`` rows (padding included)."""
        self.graphs[size].replay()
        return self.outputs[size]


class PackedStepGraphs(StepGraphs):
    """Graphs of mixed steps, one per padded token count (``sizes``), over ``num_seqs`` sequences (the input
    buffers' capacity): real rows packed, then a padding sequence, then empty ones. ``model_runner`` lays a step
    out so (``_prepare`` with ``packed_tokens``)."""

    def __init__(self, model: torch.nn.Module, buffers: InputBuffers, sizes: list[int], max_model_len: int,
                 num_seqs: int):  # fmt: skip
        super().__init__(model, buffers, sizes, max_model_len)
        self.num_seqs = num_seqs

    def _rows(self, size: int) -> int:
        return size

    def _metadata(self, size: int):
        qsl = [0] + [size] * self.num_seqs
        seq_lens = [size] + [0] * (self.num_seqs - 1)
        return self.buffers.metadata(size, self.num_seqs, size, self.max_model_len, qsl, seq_lens, for_graph=True)

    def _stage(self, size: int) -> None:
        """One sequence of ``size`` padding rows (no KV write) and empty ones after it."""
        step = self.buffers.begin_step(size, self.num_seqs)
        step.input_ids[:] = 0
        step.positions[:] = np.arange(size)
        step.slot_mapping[:] = -1
        step.seq_lens[:] = 0
        step.seq_lens[0] = size
        step.query_start_loc[0] = 0
        step.query_start_loc[1:] = size
        self.buffers.clear_block_table()
        self.buffers.upload(block_width=1, sampled=None)

    def _describe(self) -> str:
        return f"{self.sizes[0]} to {self.sizes[-1]} tokens in up to {self.num_seqs} sequences"
