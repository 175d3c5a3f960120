"""What the engine does for requests whose sampling is constrained beyond temperature and filters: it checks
token ids against the vocabulary, turns bad words into token sequences, and holds requests with a grammar back
from the scheduler until their grammar is compiled (off the engine loop, in the compiler's thread pool)."""

from __future__ import annotations

import functools
import logging
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from brisk.engine.request import Request
from brisk.engine.tokenizer_snapshot import xgrammar_tokenizer_info
from brisk.sampling_params import SamplingParams
from brisk.structured_outputs.compiler import GrammarCompiler
from brisk.structured_outputs.state import GrammarState

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05  # how long an otherwise idle engine waits for a grammar before its step returns


class RequestConstraints:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._compiler: GrammarCompiler | None = None
        self._pending: list[tuple[Future, list[Request]]] = []

    def check(self, params: SamplingParams) -> None:
        """Errors a request's constraints can raise before it is queued (ValueError naming the field)."""
        for name, ids in (("logit_bias", params.logit_bias or ()), ("allowed_token_ids", params.allowed_token_ids)):
            bad = next((t for t in ids or () if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise ValueError(f"Token id {bad} in {name} is outside the vocabulary [0, {self.vocab_size}).")
        for name in ("bad_words", "structured_outputs"):
            if getattr(params, name) is not None and self.tokenizer is None:
                raise ValueError(f"{name} needs the model's tokenizer, and this engine has none.")

    def bad_words_token_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word as it would be generated, alone and after a space (vLLM's rule)."""
        sequences: list[list[int]] = []
        for word in words:
            for text in (word, " " + word.lstrip()):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return sequences

    def hold(self, params: SamplingParams, requests: list[Request]) -> bool:
        """Set the requests' bad words; with a grammar, start compiling it and keep the requests until it is ready
        (True: do not schedule them yet)."""
        if params.bad_words:
            words = self.bad_words_token_ids(params.bad_words)
            for request in requests:
                request.bad_words_token_ids = words
        if params.structured_outputs is None:
            return False
        if self._compiler is None:
            tokenizer, vocab_size, stop_ids = self.tokenizer, self.vocab_size, sorted(self.eos_token_ids)
            load_tokenizer_info = functools.partial(xgrammar_tokenizer_info, tokenizer, vocab_size, stop_ids)
            self._compiler = GrammarCompiler(load_tokenizer_info, vocab_size)
        self._pending.append((self._compiler.submit(params.structured_outputs), requests))
        return True

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def ready(self, idle: bool) -> tuple[list[Request], list[Request]]:
        """Requests whose grammar compiled (each with its own matcher) and those whose grammar failed. An
        ``idle`` engine (nothing else to run) waits a moment for one, instead of spinning."""
        if idle and self._pending:
            wait([future for future, _ in self._pending], timeout=_IDLE_WAIT_S, return_when=FIRST_COMPLETED)
        admitted: list[Request] = []
        failed: list[Request] = []
        still: list[tuple[Future, list[Request]]] = []
        for future, requests in self._pending:
            if not future.done():
                still.append((future, requests))
            elif future.exception() is not None:
                logger.error("grammar compilation failed for %s: %s", requests[0].request_id, future.exception())
                failed.extend(requests)
            else:
                for request in requests:
                    request.grammar = GrammarState(future.result())
                admitted.extend(requests)
        self._pending = still
        return admitted, failed
