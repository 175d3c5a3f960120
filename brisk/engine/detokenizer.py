"""Incremental detokenization and stop-string matching for one completion.

Decoding only a short window of recent tokens keeps each step O(1) per request; text is emitted only once it is
stable (no partial UTF-8 sequence) and never while it could still turn into a stop string.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

# How many tokens before the unread ones give the tokenizer enough context to decode spaces and merges right.
_CONTEXT_TOKENS = 5


def fast_decoder(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``tokenizer.decode`` for one setting, calling a fast tokenizer's Rust backend directly where that gives
    the same text (no clean-up pass): transformers' wrapper costs several times the decode itself, twice per
    generated token of every streamed request."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return functools.partial(backend.decode, skip_special_tokens=skip_special_tokens)
    return functools.partial(tokenizer.decode, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer,
        prompt_token_ids: list[int],
        stop: list[str],
        skip_special_tokens: bool,
        include_stop: bool = False,
    ):
        self._decode = fast_decoder(tokenizer, skip_special_tokens)
        self.stop = stop
        self.include_stop = include_stop  # the text ends after the stop string instead of before it
        self.max_stop_len = max((len(s) for s in stop), default=0)
        self.token_ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text = ""  # everything decoded so far (stop string excluded once found)

    def append(self, token_id: int, check_stop: bool) -> str | None:
        """Add one generated token; return the stop string it completed, if any (and cut the text there)."""
        self.token_ids.append(token_id)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None  # an incomplete character: wait for more tokens
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        old_len = len(self.text)
        self.text += delta
        if not check_stop or not self.stop:
            return None
        # Only a match that ends in the new text counts (earlier text was checked, or was under min_tokens).
        found = [
            (pos, stop) for stop in self.stop if (pos := self.text.find(stop, max(0, old_len - len(stop) + 1))) >= 0
        ]
        if not found:
            return None
        pos, stop = min(found)
        self.text = self.text[: pos + len(stop) if self.include_stop else pos]
        return stop

    def flush(self) -> None:
        """At the end of a sequence, emit tokens held back as an incomplete character (as U+FFFD)."""
        if self.read_offset < len(self.token_ids):
            prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
            self.text += self._decode(self.token_ids[self.prefix_offset :])[len(prefix_text) :]
            self.read_offset = len(self.token_ids)

    def visible_text(self, finished: bool) -> str:
        """The text safe to show: while running, hold back a tail that may be the start of a stop string."""
        if finished or self.max_stop_len <= 1:
            return self.text
        return self.text[: max(0, len(self.text) - self.max_stop_len + 1)]
