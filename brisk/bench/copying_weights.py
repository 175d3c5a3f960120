"""Weights that make a model copy its input token, for measuring speculative steps whose drafts are all accepted.

Random weights accept almost no drafts, so a benchmark on them measures what proposing and rejecting costs. To
measure the other end, a step that verifies ``k`` drafts and accepts them all, at a real model's shape and cost,
the model is made to repeat its input: every greedy token equals the one fed before it, so the n-gram proposer
finds ``k`` drafts a step (the output is one token over and over) and a copying draft model proposes exactly
what the target will say.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def make_copying(model: torch.nn.Module) -> None:
    """Make ``model`` (a decoder of brisk's llama family, loaded with dummy weights) copy its input, at the same
    cost per step: its layers add nothing to the residual stream (zero output and down projections; every kernel
    still runs), the final norm scales by one, and the LM head is the embedding, whose row for a token scores that
    token's own embedding highest (random rows of a wide embedding are nearly orthogonal)."""
    for layer in model.model.layers:
        for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
            linear.weight.zero_()
            if linear.bias is not None:
                linear.bias.zero_()
    model.model.norm.weight.fill_(1)
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
