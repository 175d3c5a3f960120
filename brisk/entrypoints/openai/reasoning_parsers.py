"""Reasoning parsers: split a thinking model's output into ``reasoning_content`` and ``content`` (vLLM's fields),
chosen with ``--reasoning-parser NAME``.

- ``deepseek_r1``: the reply starts inside the reasoning (its chat template opens ``<think>`` in the prompt) and
  ``</think>`` ends it; a ``<think>`` at the start of the reply is skipped. No ``</think>``: all reasoning.
- ``qwen3``: reasoning only between ``<think>`` and ``</think>`` at the start of the reply; a reply without it
  (thinking switched off) is all content.
"""

from __future__ import annotations

from dataclasses import dataclass

_OPEN, _CLOSE = "<think>", "</think>"


@dataclass
class ReasoningSplit:
    reasoning: str | None
    content: str | None


class ReasoningParser:
    starts_in_reasoning = False

    def split(self, text: str) -> ReasoningSplit:
        """``text`` (the whole reply so far) as reasoning and content; an unfinished closing tag is held back."""
        body = text.lstrip()
        if body and _OPEN.startswith(body) and body != _OPEN:  # "<thi": may still become the opening tag
            return ReasoningSplit(None, None)
        if body.startswith(_OPEN):
            body = body[len(_OPEN) :]
        elif not self.starts_in_reasoning:
            return ReasoningSplit(None, text or None)
        end = body.find(_CLOSE)
        if end < 0:
            held = next((n for n in range(len(_CLOSE) - 1, 0, -1) if body.endswith(_CLOSE[:n])), 0)
            return ReasoningSplit(body[: len(body) - held] or None, None)
        content = body[end + len(_CLOSE) :].lstrip("\n")
        return ReasoningSplit(body[:end] or None, content or None)


class DeepSeekR1ReasoningParser(ReasoningParser):
    starts_in_reasoning = True


class Qwen3ReasoningParser(ReasoningParser):
    starts_in_reasoning = False


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}


class ReasoningStream:
    """The reasoning and content deltas of a streamed reply: what :meth:`ReasoningParser.split` gives now, less what
    was sent."""

    def __init__(self, parser: ReasoningParser):
        self.parser = parser
        self._sent_reasoning = 0
        self._sent_content = 0

    def delta(self, text: str, finished: bool) -> tuple[str, str]:
        split = self.parser.split(text)
        if finished and split.reasoning is None and split.content is None and text:
            split = ReasoningSplit(None, text)  # held back as a possible tag, but the reply ended
        reasoning, content = split.reasoning or "", split.content or ""
        out = reasoning[self._sent_reasoning :], content[self._sent_content :]
        self._sent_reasoning, self._sent_content = len(reasoning), len(content)
        return out
