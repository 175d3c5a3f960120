"""Token embedding and LM head (vocab-parallel layout; one shard when tensor parallelism is off)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.fused import dense, fused_ops_for


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ops = fused_ops_for(input_ids)
        if ops is not None:
            return ops.embedding(input_ids, self.weight)
        return F.embedding(input_ids, self.weight)


class LMHead(VocabEmbedding):
    """Projects hidden states to vocabulary logits; shares its weight with the embedding when tied."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return dense(hidden_states, self.weight)
