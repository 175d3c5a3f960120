"""Hermes format (Qwen2.5, Hermes and many fine-tunes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, after optional content."""

from __future__ import annotations

import json
import re

from brisk.entrypoints.openai.tool_parsers.base import ExtractedToolCalls, ToolParser, call_from_json, held_marker_len

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


class HermesToolParser(ToolParser):
    def start(self, text: str) -> int:
        return text.find(_OPEN)

    def marker_prefix_len(self, text: str) -> int:
        return held_marker_len(text, _OPEN)

    def extract(self, text: str) -> ExtractedToolCalls:
        begin = self.start(text)
        if begin < 0:
            return ExtractedToolCalls(text, [])
        calls = []
        for body in _BLOCK.findall(text[begin:]):
            try:
                call = call_from_json(json.loads(body))
            except ValueError:
                call = None
            if call is not None:
                calls.append(call)
        if not calls:  # a marker but nothing parseable: it was text after all
            return ExtractedToolCalls(text, [])
        content = text[:begin].strip()
        return ExtractedToolCalls(content or None, calls)

    def num_complete(self, tail: str) -> int:
        return len(self.extract(tail[: tail.rfind(_CLOSE) + len(_CLOSE)] if _CLOSE in tail else "").tool_calls)
