"""Tool-call parsers: turn a model's text into OpenAI ``tool_calls``, each for one family's output format.

Chosen with vLLM's flags: ``--enable-auto-tool-choice --tool-call-parser NAME``."""

from brisk.entrypoints.openai.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, ToolParser
from brisk.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from brisk.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from brisk.entrypoints.openai.tool_parsers.mistral import MistralToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}

__all__ = ["TOOL_PARSERS", "ExtractedToolCalls", "ParsedToolCall", "ToolParser"]
