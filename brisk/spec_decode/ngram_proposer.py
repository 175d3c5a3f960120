"""The n-gram (prompt lookup) proposer: text that repeats itself (code edits, quotes, lists) predicts itself."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from brisk.spec_decode.config import SpeculativeConfig


class NgramProposer:
    """Finds the sequence's last n tokens (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``) earlier in
    the sequence, and proposes the tokens that followed their first occurrence. No model, no device work."""

    def __init__(self, config: SpeculativeConfig):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to ``min(num_speculative_tokens, max_tokens)`` draft tokens to follow ``token_ids`` (maybe none)."""
        k = min(self.num_speculative_tokens, max_tokens)
        length = len(token_ids)
        if k <= 0 or length <= self.min_n:
            return []
        tokens = np.asarray(token_ids)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # Windows that start early enough to have at least one token after them (not the suffix itself).
            windows = sliding_window_view(tokens[: length - 1], n)
            matches = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
            if matches.size:
                start = int(matches[0]) + n
                return token_ids[start : start + k]
        return []
