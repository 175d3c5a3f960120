"""Mistral format: ``[TOOL_CALLS]`` then a JSON list of ``{"name": ..., "arguments": {...}}`` (older templates), or
``[TOOL_CALLS]name[ARGS]{...}`` per call (tokenizer v11 and newer)."""

from __future__ import annotations

import json
import re

from brisk.entrypoints.openai.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedToolCall,
    ToolParser,
    call_from_json,
    held_marker_len,
)

_MARK = "[TOOL_CALLS]"
_NAMED = re.compile(r"\s*([A-Za-z0-9_.-]+)\[ARGS\]")


class MistralToolParser(ToolParser):
    def start(self, text: str) -> int:
        return text.find(_MARK)

    def marker_prefix_len(self, text: str) -> int:
        return held_marker_len(text, _MARK)

    def extract(self, text: str) -> ExtractedToolCalls:
        begin = self.start(text)
        if begin < 0:
            return ExtractedToolCalls(text, [])
        calls: list[ParsedToolCall] = []
        decoder = json.JSONDecoder()
        for part in text[begin:].split(_MARK)[1:]:
            named = _NAMED.match(part)
            try:
                if named:
                    args, _ = decoder.raw_decode(part, named.end())
                    calls.append(ParsedToolCall(named.group(1), json.dumps(args, ensure_ascii=False)))
                    continue
                obj, _ = decoder.raw_decode(part.strip())
            except ValueError:
                continue
            for item in obj if isinstance(obj, list) else [obj]:
                call = call_from_json(item)
                if call is not None:
                    calls.append(call)
        if not calls:
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(text[:begin].strip() or None, calls)

    def num_complete(self, tail: str) -> int:
        return 0  # a call's JSON can be told complete only at the end of the reply
