"""CUDA graphs for decode-only steps: one graph per padded batch size, captured at startup.

A decode step of a small batch is dominated by kernel launches; replaying a captured graph launches the whole
forward pass at once. The graphs read the persistent input buffers, so a replay only needs those filled.
Attention metadata is captured with ``max_seq_len = max_model_len``: the decode kernel sizes its grid from
that bound and finds each sequence's real length on the device.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from brisk.forward_context import set_forward_context
from brisk.worker.input_buffers import InputBuffers

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs]
    sizes += list(range(8, max_num_seqs + 1, 8))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, buffers: InputBuffers, max_num_seqs: int, max_model_len: int):
        self.model = model
        self.buffers = buffers
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def padded_size(self, num_seqs: int) -> int | None:
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def _metadata(self, size: int):
        return self.buffers.metadata(size, size, 1, self.max_model_len, list(range(size + 1)), [1] * size)

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        buffers = self.buffers
        buffers.begin_step(self.sizes[-1], self.sizes[-1])
        buffers.fill_padding(0, 0)
        buffers.clear_block_table()
        buffers.upload(block_width=1, sampled=None)
        pool = None
        stream = torch.cuda.Stream()
        for size in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory pool
            ids, pos = buffers.on_device.input_ids[:size], buffers.on_device.positions[:size]
            with set_forward_context(self._metadata(size)):
                self.model(ids, pos)  # warm-up: compiles kernels, settles the allocator
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[size] = self.model(ids, pos)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured %d decode CUDA graphs in %.1f s", len(self.graphs), time.perf_counter() - start)

    def replay(self, size: int) -> torch.Tensor:
        self.graphs[size].replay()
        return self.outputs[size]
