"""``POST /v1/responses``: OpenAI's Responses API over the chat path.

A request becomes a chat request (``responses_protocol.to_chat_request``), so the chat template, sampling, tool
calling, reasoning parsers and structured outputs are the chat endpoint's; only the shapes differ. A reply is a
list of output items: the reasoning (with ``--reasoning-parser``), a message of ``output_text``, then one
``function_call`` item per tool call. A stream sends vLLM's (and OpenAI's) events, ``event: TYPE`` and ``data:
JSON`` each, numbered by ``sequence_number``: ``response.created``, ``response.in_progress``, then per item
``response.output_item.added``, its deltas and ``response.output_item.done``, and ``response.completed`` (also
when ``max_output_tokens`` cut the reply: its status is then ``incomplete``, as vLLM sends it). Streamed items
carry the ids of the final response's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse, Response

from brisk.engine.async_engine import RequestStream
from brisk.entrypoints.openai.errors import OpenAIError, bad_request
from brisk.entrypoints.openai.logprobs import chat_logprobs
from brisk.entrypoints.openai.protocol import ChatCompletionRequest
from brisk.entrypoints.openai.reasoning_parsers import ReasoningStream
from brisk.entrypoints.openai.responses_protocol import INCLUDABLE, ResponsesRequest, to_chat_request
from brisk.entrypoints.openai.serving_chat import OpenAIServingChat
from brisk.entrypoints.openai.serving_engine import SSEResponse, sse_event, stream_error
from brisk.entrypoints.openai.tool_calling import ToolMode
from brisk.entrypoints.openai.tool_parsers.base import ParsedToolCall
from brisk.outputs import CompletionOutput, RequestOutput
from brisk.sampling_params import _MAX_LOGPROBS as MAX_LOGPROBS  # the engine's own bound
from brisk.sampling_params import SamplingParams

# A chat request's field names in errors, as the Responses request names them.
_FIELD_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
    "truncate_prompt_tokens": "truncation",
}


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def check_responses_fields(req: ResponsesRequest) -> None:
    """Fields whose value asks for what brisk lacks: a 400 naming them (the chat request checks the rest)."""
    if req.background:
        raise bad_request("'background' is not supported: brisk keeps no responses to poll.", param="background")
    for name in ("previous_response_id", "conversation"):
        if getattr(req, name) is not None:
            raise bad_request(
                f"'{name}' is not supported: brisk keeps no responses; send the whole conversation in 'input'.",
                param=name,
            )
    if req.prompt is not None:
        raise bad_request("'prompt' (a stored prompt template) is not supported.", param="prompt")
    for value in req.include or []:
        if value not in INCLUDABLE:
            raise bad_request(f"'include' value {value!r} is not one of {list(INCLUDABLE)}.", param="include")
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        raise bad_request("'text.verbosity' is not supported: only 'medium' (the default).", param="text.verbosity")
    if req.reasoning is not None and {req.reasoning.summary, req.reasoning.generate_summary} - {None, "auto"}:
        raise bad_request("'reasoning.summary' is not supported: brisk writes no summaries.", param="reasoning")
    if req.enable_response_messages:
        raise bad_request("'enable_response_messages' is not supported.", param="enable_response_messages")
    if req.previous_input_messages:
        raise bad_request("'previous_input_messages' is not supported.", param="previous_input_messages")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise bad_request(f"'top_logprobs' must be in [0, {MAX_LOGPROBS}].", param="top_logprobs")


def _renamed(exc: OpenAIError) -> OpenAIError:
    """An error of the chat request, with the field named as the Responses request names it."""
    param = exc.param.split(".", 1)[0].split("[", 1)[0] if exc.param else None
    if param in _FIELD_NAMES:
        exc.message = exc.message.replace(f"'{param}'", f"'{_FIELD_NAMES[param]}'")
        exc.param = _FIELD_NAMES[param]
    return exc


class _Reply:
    """The response being built: its id, the request's echoed fields and the output items so far."""

    def __init__(self, req: ResponsesRequest, chat: ChatCompletionRequest, model: str, params: SamplingParams):
        self.id = req.request_id or _item_id("resp")
        self.created_at = int(time.time())
        self.req, self.chat, self.model, self.params = req, chat, model, params
        self.items: list[dict[str, Any]] = []

    def body(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object; its output items and usage only once it is complete or incomplete."""
        req = self.req
        final = status in ("completed", "incomplete")
        incomplete = status == "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "model": self.model,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": req.instructions,
            "max_output_tokens": self.params.max_tokens,
            "max_tool_calls": req.max_tool_calls,
            "metadata": req.metadata,
            "output": list(self.items) if final else [],
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": req.reasoning.model_dump() if req.reasoning is not None else None,
            "service_tier": req.service_tier or "auto",
            "store": False,
            "temperature": self.params.temperature,
            "text": req.text.model_dump(by_alias=True) if req.text is not None else {"format": {"type": "text"}},
            "tool_choice": self.tool_choice(),
            "tools": [tool.model_dump() for tool in req.tools],
            "top_logprobs": req.top_logprobs,
            "top_p": self.params.top_p,
            "truncation": req.truncation,
            "usage": usage,
            "user": req.user,
        }

    def tool_choice(self) -> str | dict[str, Any]:
        """The echoed choice: ``none`` without tools (the default ``auto`` has nothing to choose from), as vLLM."""
        choice = self.req.tool_choice
        if not self.req.tools:
            return "none"
        return choice if isinstance(choice, str) else choice.model_dump()

    def logprobs(self, serving: OpenAIServingChat, token_ids: list[int], positions: list) -> list[dict] | None:
        if not self.req.wants_logprobs():
            return None
        tokens = chat_logprobs(serving.logprobs_tokenizer(self.chat), token_ids, positions, self.req.top_logprobs or 0)
        return [t.model_dump() for t in tokens]


def _status(completion: CompletionOutput) -> str:
    return "incomplete" if completion.finish_reason == "length" else "completed"


def _text_part(text: str, logprobs: list[dict] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _message(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": parts}


def _reasoning(item_id: str, text: str | None) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text is not None else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content}


def _function_call(call: ParsedToolCall, status: str, arguments: str | None = None) -> dict[str, Any]:
    return {
        "id": "fc_" + call.id.removeprefix("call_"),
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if arguments is None else arguments,
        "status": status,
    }


class OpenAIServingResponses:
    """The Responses endpoint, on the chat endpoint's machinery."""

    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    def usage(self, output: RequestOutput) -> dict[str, Any]:
        usage = self.chat.usage([output])
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        return {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens,
        }

    async def create(self, req: ResponsesRequest) -> Response:
        check_responses_fields(req)
        self.chat.check_stream_options(req.stream, req.stream_options)
        try:
            chat = to_chat_request(req)
        except ValidationError as exc:  # a value the chat request refuses (the Responses request let it through)
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise _renamed(bad_request(f"'{where}': {error['msg']}", param=where)) from None
        if req.truncation == "auto":  # keep the input's last tokens, leaving room for the reply (vLLM's rule)
            chat.truncate_prompt_tokens = max(1, self.chat.max_model_len - (req.max_output_tokens or 1))
        try:
            model = self.chat.check_model(chat.model)
            prompt_ids, params, mode = await self.chat.prepare(chat)
            reply = _Reply(req, chat, model, params)
            stream = await self.chat.submit(reply.id, prompt_ids, params, chat.cache_salt)
        except OpenAIError as exc:
            raise _renamed(exc) from None
        if req.stream:
            return SSEResponse(self._stream(reply, stream, mode), [stream])
        output = await self.chat.final_output(stream)
        completion = output.outputs[0]
        reasoning, content, calls = self.chat.parse_reply(chat, mode, completion.text)
        if reasoning is not None:
            reply.items.append({**_reasoning(_item_id("rs"), reasoning), "status": "completed"})
        if content:
            logprobs = reply.logprobs(self.chat, completion.token_ids, completion.logprobs or [])
            reply.items.append(_message(_item_id("msg"), [_text_part(content, logprobs)], "completed"))
        reply.items.extend(_function_call(call, "completed") for call in calls)
        return JSONResponse(reply.body(_status(completion), self.usage(output)))

    async def _stream(self, reply: _Reply, stream: RequestStream, mode: ToolMode) -> AsyncIterator[str]:
        events = _Events(reply)
        tool_parser, reasoning_parser = self.chat.parsers()
        reasoning = ReasoningStream(reasoning_parser) if reasoning_parser is not None else None
        sent_chars, sent_tokens, pending_logprobs = [0], 0, []
        try:
            yield events.event("response.created", response=reply.body("in_progress"))
            yield events.event("response.in_progress", response=reply.body("in_progress"))
            async for output in stream:
                completion = output.outputs[0]
                finished = completion.finish_reason is not None
                new_ids = completion.token_ids[sent_tokens:]
                positions = (completion.logprobs or [])[sent_tokens : len(completion.token_ids)]
                pending_logprobs += reply.logprobs(self.chat, new_ids, positions) or []
                sent_tokens = len(completion.token_ids)
                delta = self.chat.stream_delta(completion.text, finished, sent_chars, 0, mode, tool_parser, reasoning)
                if delta.get("reasoning_content") and reply.chat.include_reasoning:
                    for event in events.reasoning(delta["reasoning_content"]):
                        yield event
                if delta.get("content"):
                    for event in events.text(delta["content"], pending_logprobs):
                        yield event
                    pending_logprobs = []
                for call in delta.get("tool_calls", []):
                    for event in events.function_call(call):
                        yield event
                if finished:
                    events.logprobs += pending_logprobs if events.open and events.open["type"] == "message" else []
                    for event in events.close():
                        yield event
                    yield events.event(
                        "response.completed", response=reply.body(_status(completion), self.usage(output))
                    )
                    return
        except Exception as exc:  # headers are sent: report in-band, never drop the connection silently
            yield events.error(exc)
        finally:
            stream.abort()


class _Events:
    """The stream's events, numbered, with the open output item (a reasoning or a message) and its text."""

    def __init__(self, reply: _Reply):
        self.reply = reply
        self.sequence_number = 0
        self.open: dict[str, Any] | None = None
        self.text_so_far = ""
        self.logprobs: list[dict] = []

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return sse_event(kind, data)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.open["id"], "output_index": len(self.reply.items)}

    def _start(self, item: dict[str, Any]) -> list[str]:
        events = self.close()
        self.open, self.text_so_far, self.logprobs = item, "", []
        events.append(self.event("response.output_item.added", output_index=len(self.reply.items), item=item))
        return events

    def reasoning(self, delta: str) -> list[str]:
        events = [] if self.open and self.open["type"] == "reasoning" else self._start(_reasoning(_item_id("rs"), None))
        self.text_so_far += delta
        events.append(self.event("response.reasoning_text.delta", content_index=0, delta=delta, **self._where()))
        return events

    def text(self, delta: str, logprobs: list[dict]) -> list[str]:
        events = []
        if not (self.open and self.open["type"] == "message"):
            events = self._start(_message(_item_id("msg"), [], "in_progress"))
            part = _text_part("", None)
            events.append(self.event("response.content_part.added", content_index=0, part=part, **self._where()))
        self.text_so_far += delta
        self.logprobs += logprobs
        events.append(
            self.event("response.output_text.delta", content_index=0, delta=delta, logprobs=logprobs, **self._where())
        )
        return events

    def function_call(self, call: ParsedToolCall) -> list[str]:
        """A call, sent whole once the parser has it complete."""
        events = self.close()
        where = {"item_id": _function_call(call, "")["id"], "output_index": len(self.reply.items)}
        events.append(self.event("response.output_item.added", output_index=where["output_index"],
                                 item=_function_call(call, "in_progress", arguments="")))  # fmt: skip
        events.append(self.event("response.function_call_arguments.delta", delta=call.arguments, **where))
        events.append(self.event("response.function_call_arguments.done", arguments=call.arguments,
                                 name=call.name, **where))  # fmt: skip
        done = _function_call(call, "completed")
        events.append(self.event("response.output_item.done", output_index=where["output_index"], item=done))
        self.reply.items.append(done)
        return events

    def close(self) -> list[str]:
        """Finish the open item: its text's done events, then the item's."""
        if self.open is None:
            return []
        where, text = self._where(), self.text_so_far
        if self.open["type"] == "reasoning":
            item = {**_reasoning(self.open["id"], text), "status": "completed"}
            events = [self.event("response.reasoning_text.done", content_index=0, text=text, **where)]
        else:
            part = _text_part(text, self.logprobs)
            item = _message(self.open["id"], [part], "completed")
            events = [
                self.event("response.output_text.done", content_index=0, text=text, logprobs=self.logprobs, **where),
                self.event("response.content_part.done", content_index=0, part=part, **where),
            ]
        events.append(self.event("response.output_item.done", output_index=where["output_index"], item=item))
        self.reply.items.append(item)
        self.open = None
        return events

    def error(self, exc: BaseException) -> str:
        """An error after the events began: OpenAI's ``error`` event with the error's code, message and field."""
        err = stream_error(exc)
        return self.event("error", code=err.code or err.type, message=err.message, param=err.param)
