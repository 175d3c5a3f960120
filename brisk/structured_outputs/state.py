"""One request's place in its grammar: which tokens may come next, and the tokens it has taken."""

from __future__ import annotations

from typing import Any

import torch


class GrammarState:
    def __init__(self, compiled: Any):
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)
        self.failed = False  # a token the grammar does not allow was appended (e.g. min_tokens banned the end)

    def accept(self, token_id: int) -> None:
        if not self.failed and not self._matcher.accept_token(token_id):
            self.failed = True

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token taken: nothing more can follow."""
        return self._matcher.is_terminated()

    @property
    def done(self) -> bool:
        return self.failed or self.is_terminated

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def next_token_bitmask(self, vocab_size: int) -> torch.Tensor:
        """The tokens allowed next as one bitmask row (int32 words), for a worker that samples elsewhere."""
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._matcher.fill_next_token_bitmask(bitmask, 0)
        return bitmask[0]


class GrammarMask:
    """A worker's stand-in for a request's ``GrammarState``: the next-token bitmask the driver computed for this
    step (the matcher lives on the driver, which advances it with each token)."""

    done = False

    def __init__(self, bitmask: torch.Tensor):
        self.bitmask = bitmask

    def accept(self, token_id: int) -> None:
        pass  # the driver's matcher takes the token; the next step brings the next bitmask

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].copy_(self.bitmask)


def apply_grammar_bitmask(logits: torch.Tensor, states: list[GrammarState | GrammarMask | None]) -> None:
    """Mask, in place, the logits of every row that has a grammar to the tokens it allows next."""
    rows = [row for row, state in enumerate(states) if state is not None and not state.done]
    if not rows:
        return
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(states), logits.shape[-1])
    for row in rows:
        states[row].fill_bitmask(bitmask, row)
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=rows)
