"""Token embedding and LM head, vocab-parallel: with tensor parallelism each rank holds a contiguous slice of
the vocabulary's rows (the vocabulary padded up to a multiple of the rank count; padding rows are zero and
their logits are cut off). One rank holds the whole table, and its path is the plain one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.distributed.parallel_state import (
    get_tp_rank,
    get_tp_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from brisk.layers.fused import dense, fused_ops_for
from brisk.layers.linear import check_loaded_shape


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_size = get_tp_size()
        self.rows_per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = get_tp_rank() * self.rows_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a whole ``(vocab, hidden)`` table, zero-padded to ``rows_per_rank``."""
        check_loaded_shape(full, (self.vocab_size, self.weight.shape[1]))
        rows = full[self.vocab_start : self.vocab_start + self.rows_per_rank]
        if rows.shape[0] == self.rows_per_rank:
            return rows
        return torch.cat([rows, rows.new_zeros(self.rows_per_rank - rows.shape[0], rows.shape[1])])

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(self.shard(loaded))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            # Each rank embeds the ids in its slice (zeros elsewhere); the sum over ranks is the whole lookup.
            local = input_ids - self.vocab_start
            outside = (local < 0) | (local >= self.rows_per_rank)
            embedded = F.embedding(local.masked_fill(outside, 0), self.weight)
            return tensor_model_parallel_all_reduce(embedded.masked_fill_(outside[:, None], 0))
        ops = fused_ops_for(input_ids)
        if ops is not None:
            return ops.embedding(input_ids, self.weight)
        return F.embedding(input_ids, self.weight)


class LMHead(VocabEmbedding):
    """Projects hidden states to vocabulary logits; shares its weight with the embedding when tied. With tensor
    parallelism each rank computes its slice's logits and every rank gets the whole row (for sampling)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = dense(hidden_states, self.weight)
        if self.tp_size == 1:
            return logits
        return tensor_model_parallel_all_gather(logits)[..., : self.vocab_size]
