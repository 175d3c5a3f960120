"""Llama 3.1+ JSON format: the reply is a JSON object ``{"name": ..., "parameters": {...}}`` (after an optional
``<|python_tag|>``), several separated by ``;``."""

from __future__ import annotations

import json

from brisk.entrypoints.openai.tool_parsers.base import ExtractedToolCalls, ToolParser, call_from_json

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
        body = text[begin:].removeprefix(_TAG).strip()
        decoder = json.JSONDecoder()
        calls, pos = [], 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except ValueError:
                break
            call = call_from_json(obj)
            if call is None:
                break
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \n\t;":
                pos += 1
        if not calls or (pos < len(body) and body[pos:].strip()):  # not JSON calls alone: plain content
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(None, calls)

    def num_complete(self, tail: str) -> int:
        return 0  # a JSON reply is whole only at the end (a ';' may add another call)
