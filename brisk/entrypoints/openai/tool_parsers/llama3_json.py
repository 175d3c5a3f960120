"""Llama 3.1+ JSON format: the reply is a JSON object ``{"name": ..., "parameters": {...}}`` (after an optional
``<|python_tag|>``), several separated by ``;``."""

from __future__ import annotations

from brisk.entrypoints.openai.tool_parsers.base import ExtractedToolCalls, ToolParser, bare_json_calls

_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    def start(self, text: str) -> int:
        stripped = text.lstrip()
        if stripped.startswith(_TAG) or stripped.startswith("{"):
            return len(text) - len(stripped)
        return -1

    def marker_prefix_len(self, text: str) -> int:
        return len(text) if not text.strip() or _TAG.startswith(text.lstrip()) else 0

    def extract(self, text: str) -> ExtractedToolCalls:
        begin = self.start(text)
        if begin < 0:
            return ExtractedToolCalls(text, [])
        calls = bare_json_calls(text[begin:].removeprefix(_TAG).strip())
        if not calls:  # not JSON calls alone: plain content
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(None, calls)

    def num_complete(self, tail: str) -> int:
        return 0  # a JSON reply is whole only at the end (a ';' may add another call)
