"""Grammar compilation off the engine loop: a thread pool, and a cache of compiled grammars keyed by constraint.

The tokenizer's vocabulary is read once (on the first structured request, in the pool), so engines that never see
one pay nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from brisk.structured_outputs.params import StructuredOutputsParams

_CACHE_SIZE = 256  # compiled grammars kept (least recently submitted dropped first)
# Free whitespace between JSON tokens, at most this many characters a gap: a weak model can otherwise loop on
# whitespace until max_tokens (indentation up to 7 levels of 4 spaces still fits).
MAX_JSON_WHITESPACE = 32


def json_whitespace(params: StructuredOutputsParams) -> dict:
    """xgrammar's whitespace options for a JSON constraint."""
    if params.disable_any_whitespace:
        return {"any_whitespace": False}
    return {"any_whitespace": True, "max_whitespace_cnt": MAX_JSON_WHITESPACE}


class GrammarCompiler:
    def __init__(self, load_tokenizer_info: Callable[[], Any], vocab_size: int, max_workers: int = 2):
        """``load_tokenizer_info`` returns xgrammar's ``TokenizerInfo`` of the vocabulary grammars are compiled
        against (``vocab_size`` entries); it is called once, in the pool."""
        self._load_tokenizer_info = load_tokenizer_info
        self._vocab_size = vocab_size
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="brisk-grammar")
        self._cache: dict[tuple, Future] = {}

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def submit(self, params: StructuredOutputsParams) -> Future:
        """A future of the compiled grammar (the same future for an equal constraint, while it is cached)."""
        key = params.cache_key()
        with self._lock:
            future = self._cache.pop(key, None)
            if future is None or (future.done() and future.exception() is not None):  # a failure is not kept
                future = self._pool.submit(self._compile, params)
            self._cache[key] = future  # most recent last
            while len(self._cache) > _CACHE_SIZE:
                del self._cache[next(iter(self._cache))]
        return future

    def _xgrammar_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                self._compiler = xgr.GrammarCompiler(self._load_tokenizer_info(), max_threads=2, cache_enabled=False)
            return self._compiler

    def _compile(self, params: StructuredOutputsParams) -> Any:
        compiler = self._xgrammar_compiler()
        kind = params.kind
        if kind in ("json", "json_object"):  # json_object: an object, as OpenAI means (not any JSON value)
            schema = params.schema_text() if kind == "json" else '{"type": "object"}'
            return compiler.compile_json_schema(schema, **json_whitespace(params))
        if kind == "regex":
            return compiler.compile_regex(params.regex)
        return compiler.compile_grammar(params.ebnf())

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
