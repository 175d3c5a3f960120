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
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from brisk.forward_context import set_forward_context
from brisk.worker.input_buffers import InputBuffers

logger = logging.getLogger(__name__)

# Speculative verification graphs go up to this many sequences: above it a step of 1 + k tokens per sequence is
# no longer launch-bound, and speculation seldom pays there (docs/speculative-decoding.md).
MAX_VERIFY_GRAPH_SEQS = 64


# One-sequence prefill graphs are captured at these query lengths. Below 1,024 tokens a prefill of an 8B model
# is host-bound (a 128-token prompt: 328 kernels, 5.3 ms on an H200's GPU, about 19 ms of launches on its host).
PREFILL_GRAPH_QUERY_LENS = (16, 32, 64, 128, 256, 512, 1024)


def prefill_query_lens(max_num_batched_tokens: int, max_tokens: int, max_model_len: int) -> list[int]:
    """Query lengths of the one-sequence prefill graphs that fit the input buffers (``max_tokens`` rows) and the
    context, up to the first that holds a whole step's budget: a longer graph would never be replayed."""
    lens = [q for q in PREFILL_GRAPH_QUERY_LENS if q <= min(max_tokens, max_model_len)]
    needed = [q for q in lens if q < max_num_batched_tokens]
    return lens[: len(needed) + 1]


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
        return self.buffers.metadata(size * q, size, q, self.max_model_len, qsl, [q] * size)

    @torch.inference_mode()
    def capture(self, pool=None, what: str = "decode"):
        """Capture every size (largest first, so smaller graphs reuse its memory); returns the memory pool, which
        another graph set may share."""
        start = time.perf_counter()
        buffers, q = self.buffers, self.query_len
        largest = self.sizes[-1]
        buffers.begin_step(largest * q, largest)
        buffers.fill_padding(0, 0, q)
        buffers.clear_block_table()
        buffers.upload(block_width=1, sampled=None)
        stream = torch.cuda.Stream()
        for size in reversed(self.sizes):
            ids, pos = buffers.on_device.input_ids[: size * q], buffers.on_device.positions[: size * q]
            with set_forward_context(self._metadata(size)):
                self.model(ids, pos)  # warm-up: compiles kernels, settles the allocator
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[size] = self.model(ids, pos)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info(
            "captured %d %s CUDA graphs (%d tokens per sequence) in %.1f s",
            len(self.graphs), what, q, time.perf_counter() - start,
        )  # fmt: skip
        return pool

    def replay(self, size: int) -> torch.Tensor:
        """The hidden states of all ``size * query_len`` rows (padding included)."""
        self.graphs[size].replay()
        return self.outputs[size]
