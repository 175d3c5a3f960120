"""Tools in chat completions: how ``tools`` and ``tool_choice`` turn into a prompt, a constraint and a parse.

- ``"none"`` (or no tools): the reply is text.
- ``"auto"``: the model decides; the server's ``--tool-call-parser`` finds calls in its text (needs
  ``--enable-auto-tool-choice``, as in vLLM).
- ``"required"`` and a named function: structured outputs force valid calls (a JSON array of
  ``{"name", "parameters"}`` objects, or the named function's arguments), so the arguments always parse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from brisk.engine.tokenizer import template_message as chat_template_message
from brisk.entrypoints.openai.errors import bad_request
from brisk.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from brisk.entrypoints.openai.tool_parsers import ParsedToolCall, ToolParser
from brisk.structured_outputs import StructuredOutputsParams


@dataclass
class ToolMode:
    kind: str  # "none", "auto", "required" or "named"
    name: str | None = None  # the named function
    parallel: bool = True

    def constraint(self, req: ChatCompletionRequest) -> StructuredOutputsParams | None:
        tools = {t.function.name: t.function for t in req.tools or []}
        if self.kind == "named":
            schema = tools[self.name].parameters or {"type": "object"}
            return StructuredOutputsParams(json=schema)
        if self.kind == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "parameters": fn.parameters or {"type": "object"}},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for name, fn in tools.items()
            ]
            schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
            if not self.parallel:
                schema["maxItems"] = 1
            return StructuredOutputsParams(json=schema)
        return None

    def calls(self, text: str, parser: ToolParser | None) -> tuple[str | None, list[ParsedToolCall]]:
        """The reply's content and tool calls (at the end of a request)."""
        if self.kind == "named":
            return None, [ParsedToolCall(self.name or "", _compact(text))]
        if self.kind == "required":
            try:
                items = json.loads(text)
            except ValueError:  # cut by max_tokens: not a complete call
                return text, []
            return None, [ParsedToolCall(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
        if self.kind == "auto" and parser is not None:
            extracted = parser.extract(text)
            calls = extracted.tool_calls if self.parallel else extracted.tool_calls[:1]
            return extracted.content, calls
        return text, []


def _compact(text: str) -> str:
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text


def tool_mode(req: ChatCompletionRequest, auto_enabled: bool) -> ToolMode:
    """What the request asks of tools; a 400 for what cannot be served."""
    choice = req.tool_choice
    parallel = req.parallel_tool_calls is not False
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'.", param="tool_choice")
        return ToolMode("none")
    if choice == "none":
        return ToolMode("none")
    if choice is None or choice == "auto":
        if not auto_enabled:
            raise bad_request(
                '"auto" tool choice (the default when tools are given) needs the server started with '
                '--enable-auto-tool-choice and --tool-call-parser NAME; or send tool_choice "required", a named '
                'function, or "none".',
                param="tool_choice",
            )
        return ToolMode("auto", parallel=parallel)
    if choice == "required":
        return ToolMode("required", parallel=parallel)
    names = [t.function.name for t in req.tools]
    if choice.function.name not in names:
        raise bad_request(
            f"tool_choice names the function {choice.function.name!r}, which is not among the tools ({names}).",
            param="tool_choice",
        )
    return ToolMode("named", name=choice.function.name)


def template_message(m: ChatMessage) -> dict[str, Any]:
    """A message as chat templates take it (``tokenizer.template_message``): tool calls with their arguments as
    objects, tool results with their call id."""
    entry: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.name is not None:
        entry["name"] = m.name
    if m.tool_calls:
        entry["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in m.tool_calls
        ]
    if m.tool_call_id is not None:
        entry["tool_call_id"] = m.tool_call_id
    return chat_template_message(entry)
