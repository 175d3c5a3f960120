"""What every tool-call parser does: split a model's output into plain content and tool calls, at the end of a
request and while it streams.

Streaming works on the text so far: content before a tool call's opening marker is released as it comes; from
the marker on, text is held until a call is complete, which then goes out as one ``tool_calls`` delta (name and
whole arguments: OpenAI's clients join deltas by index, so one delta per call is a valid stream)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


@dataclass
class ExtractedToolCalls:
    content: str | None
    tool_calls: list[ParsedToolCall]


@dataclass
class StreamDelta:
    content: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


def held_marker_len(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` begin ``marker`` (so may still become it)."""
    return next((n for n in range(len(marker) - 1, 0, -1) if text.endswith(marker[:n])), 0)


def call_from_json(obj: Any, arguments_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedToolCall | None:
    """``{"name": ..., "arguments": {...}}`` (or ``parameters``) as a call; anything else is None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in arguments_keys if k in obj), {})
    return ParsedToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def bare_json_calls(body: str) -> list[ParsedToolCall]:
    """``body`` as JSON call objects alone, separated by whitespace or ``;``; empty when it is anything else."""
    decoder = json.JSONDecoder()
    calls, pos = [], 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except ValueError:
            return []
        call = call_from_json(obj)
        if call is None:
            return []
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \n\t\r;":
            pos += 1
    return calls


class ToolParser:
    """Subclasses implement :meth:`extract` (whole text) and :meth:`start` (where tool calls begin, or -1)."""

    def __init__(self, tokenizer: Any = None):
        self.tokenizer = tokenizer
        self._released = 0  # characters of content already streamed
        self._calls_sent = 0

    def extract(self, text: str) -> ExtractedToolCalls:
        raise NotImplementedError

    def start(self, text: str) -> int:
        """Where the first tool call's marker begins in ``text``, or -1 (the whole text is content)."""
        raise NotImplementedError

    def marker_prefix_len(self, text: str) -> int:
        """How many trailing characters of ``text`` could be the beginning of a tool-call marker (held back)."""
        return 0

    def stream(self, text: str, finished: bool) -> StreamDelta:
        """The delta to send now, given the whole text so far."""
        begin = self.start(text)
        if begin < 0:
            end = len(text) if finished else len(text) - self.marker_prefix_len(text)
            delta = StreamDelta(text[self._released : max(end, self._released)])
            self._released = max(end, self._released)
            return delta
        delta = StreamDelta(text[self._released : begin] if begin > self._released else "")
        self._released = max(self._released, begin)
        calls = self.extract(text).tool_calls
        complete = calls if finished else calls[: self.num_complete(text[begin:])]
        delta.tool_calls = complete[self._calls_sent :]
        self._calls_sent = max(self._calls_sent, len(complete))
        return delta

    def num_complete(self, tail: str) -> int:
        """How many tool calls in ``tail`` (from the first marker on) are complete, while more text may come."""
        return len(self.extract(tail).tool_calls)
