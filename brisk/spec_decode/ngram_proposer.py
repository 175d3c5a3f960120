"""The n-gram (prompt lookup) proposer: text that repeats itself (code edits, quotes, lists) predicts itself.

A speculative step waits for its proposal, so the lookup is on the critical path of every step: each request's
tokens are kept as an array that grows with it (converting a 4,000-token list every step cost more than the
lookup), and the lookup is one vectorized comparison over the sequence, then a few over the places where its last
token occurred before.
"""

from __future__ import annotations

import weakref

import numpy as np

from brisk.engine.request import Request
from brisk.spec_decode.config import SpeculativeConfig


def continuation_start(tokens: np.ndarray, min_n: int, max_n: int) -> int | None:
    """Where the tokens that followed the first earlier occurrence of the sequence's last ``n`` tokens begin, for
    the largest ``n`` from ``max_n`` down to ``min_n`` that occurs earlier (``len(tokens) > min_n``); None if none
    does. An occurrence ends before the last token, so it has at least one token after it."""
    length = len(tokens)
    max_n = min(max_n, length - 1)
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])  # where an occurrence could end
    if not ends.size:
        return None
    matched = np.ones(ends.size, dtype=np.int64)  # suffix tokens matched backwards from each end
    alive = np.ones(ends.size, dtype=bool)
    for j in range(1, max_n):
        before = ends - j
        alive &= before >= 0
        alive[alive] = tokens[before[alive]] == tokens[length - 1 - j]
        if not alive.any():
            break
        matched += alive
    for n in range(max_n, min_n - 1, -1):
        hits = np.flatnonzero(matched >= n)
        if hits.size:
            return int(ends[hits[0]]) + 1
    return None


class NgramProposer:
    """Finds the sequence's last n tokens (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``) earlier in
    the sequence, and proposes the tokens that followed their first occurrence. No model, no device work."""

    def __init__(self, config: SpeculativeConfig):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        # Per request: an array holding its tokens (with room to grow) and how many; goes with the request.
        self._tokens: weakref.WeakKeyDictionary[Request, tuple[np.ndarray, int]] = weakref.WeakKeyDictionary()
        # Per request: its last lookup, (tokens looked over, where the continuation starts): the engine asks
        # may_propose and then propose over the same tokens.
        self._found: weakref.WeakKeyDictionary[Request, tuple[int, int | None]] = weakref.WeakKeyDictionary()

    def propose(self, request: Request, max_tokens: int) -> list[int]:
        """Up to ``min(num_speculative_tokens, max_tokens)`` draft tokens to follow the request's tokens (maybe
        none)."""
        k = min(self.num_speculative_tokens, max_tokens)
        start = self._continuation_start(request) if k > 0 else None
        return [] if start is None else request.all_token_ids[start : start + k]

    def may_propose(self, request: Request) -> bool:
        """Whether the request's tokens known now end in an n-gram that occurs earlier (what :meth:`propose` looks
        for). The engine asks it one step behind, with the next step's token still on the device: where no
        request finds one, it launches that step ahead without drafts, as a plain decode (see ``LLMEngine.step``).
        """
        return self._continuation_start(request) is not None

    def _continuation_start(self, request: Request) -> int | None:
        """:func:`continuation_start` over the request's tokens, looked up once for each length they reach."""
        token_ids = request.all_token_ids
        length = len(token_ids)
        if length <= self.min_n:
            return None
        found = self._found.get(request)
        if found is None or found[0] != length:
            found = (length, continuation_start(self._array(request, token_ids), self.min_n, self.max_n))
            self._found[request] = found
        return found[1]

    def _array(self, request: Request, token_ids: list[int]) -> np.ndarray:
        """The request's tokens as an array: the cached one extended by the tokens appended since (rebuilt if the
        list no longer starts with what it holds, as after a truncation)."""
        length = len(token_ids)
        buffer, known = self._tokens.get(request, (None, 0))
        if buffer is None or known > length or (known and buffer[known - 1] != token_ids[known - 1]):
            buffer, known = np.empty(max(64, 2 * length), dtype=np.int64), 0
        elif len(buffer) < length:
            grown = np.empty(2 * length, dtype=np.int64)
            grown[:known] = buffer[:known]
            buffer = grown
        buffer[known:length] = token_ids[known:length]
        self._tokens[request] = (buffer, length)
        return buffer[:length]
