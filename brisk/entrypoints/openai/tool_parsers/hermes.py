"""Hermes format (Qwen2.5, Hermes and many fine-tunes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, after optional content. A reply that is nothing but such JSON objects, without the tags, is
read as calls too: Qwen2.5-Coder writes its calls that way under the same chat template."""

from __future__ import annotations

import json
import re

from brisk.entrypoints.openai.tool_parsers.base import (
    ExtractedToolCalls,
    ToolParser,
    bare_json_calls,
    call_from_json,
    held_marker_len,
)

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


class HermesToolParser(ToolParser):
    def start(self, text: str) -> int:
        stripped = text.lstrip()
        if stripped.startswith("{"):  # possibly bare JSON calls: held until the reply ends
            return len(text) - len(stripped)
        return text.find(_OPEN)

    def marker_prefix_len(self, text: str) -> int:
        return len(text) if not text.strip() else held_marker_len(text, _OPEN)

    def extract(self, text: str) -> ExtractedToolCalls:
        begin = self.start(text)
        if begin < 0:
            return ExtractedToolCalls(text, [])
        if _OPEN not in text:
            calls = bare_json_calls(text.strip())
            return ExtractedToolCalls(None if calls else text, calls)
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
        if _CLOSE not in tail:
            return 0  # no closed block yet (bare JSON calls are whole only at the end)
        return len(self.extract(tail[: tail.rfind(_CLOSE) + len(_CLOSE)]).tool_calls)
