"""``POST /v1/chat/completions``: the chat template renders the messages, one engine request carries the ``n``
choices."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response

from brisk.engine.async_engine import RequestStream
from brisk.entrypoints.openai.errors import bad_request
from brisk.entrypoints.openai.logprobs import ALL, chat_logprobs, prompt_logprobs
from brisk.entrypoints.openai.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    UsageInfo,
)
from brisk.entrypoints.openai.reasoning_parsers import REASONING_PARSERS, ReasoningParser, ReasoningStream
from brisk.entrypoints.openai.serving_engine import (
    SSE_DONE,
    OpenAIServing,
    ResponseIds,
    SSEResponse,
    error_event,
    requested_prompt_logprobs,
    sse,
)
from brisk.entrypoints.openai.tool_calling import ToolMode, tool_mode
from brisk.entrypoints.openai.tool_parsers import TOOL_PARSERS, ToolParser
from brisk.sampling_params import SamplingParams


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """What the chat template is given besides the messages: ``chat_template_kwargs``, with vLLM's ``documents``
    and ``reasoning_effort`` (which also sets ``enable_thinking``, false for ``"none"``, unless the kwargs set it)."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.documents is not None:
        kwargs["documents"] = req.documents
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
        kwargs.setdefault("enable_thinking", req.reasoning_effort != "none")
    return kwargs or None


class OpenAIServingChat(OpenAIServing):
    def _params(self, req: ChatCompletionRequest, num_prompt_tokens: int, mode: ToolMode) -> SamplingParams:
        if req.max_completion_tokens is not None and req.max_tokens not in (None, req.max_completion_tokens):
            raise bad_request(
                "'max_tokens' (deprecated) and 'max_completion_tokens' differ: give one of them.", param="max_tokens"
            )
        if req.max_completion_tokens is not None:
            requested, param = req.max_completion_tokens, "max_completion_tokens"
        else:
            requested, param = req.max_tokens, "max_tokens"
        max_tokens = self.resolve_max_tokens(requested, num_prompt_tokens, param)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
        fields = {}
        constraint = mode.constraint(req)
        if constraint is not None:
            if req.response_format is not None and req.response_format.type != "text" or req.structured_outputs:
                raise bad_request(
                    f"tool_choice {mode.kind!r} constrains the reply itself: drop 'response_format'.",
                    param="tool_choice",
                )
            fields["structured_outputs"] = constraint
        return self.request_sampling_params(
            req,
            max_tokens,
            param_names={"logprobs": "top_logprobs", "max_tokens": param},
            logprobs=(req.top_logprobs or 0) if req.logprobs and not req.logprob_token_ids else None,
            prompt_logprobs=requested_prompt_logprobs(req),
            **fields,
        )

    def parsers(self) -> tuple[ToolParser | None, ReasoningParser | None]:
        """Fresh parsers for one choice (streaming parsers keep state)."""
        tool = TOOL_PARSERS[self.config.tool_call_parser](self.tokenizer) if self.config.tool_call_parser else None
        reasoning = REASONING_PARSERS[self.config.reasoning_parser]() if self.config.reasoning_parser else None
        return tool, reasoning

    async def create(self, req: ChatCompletionRequest) -> Response:
        model = self.check_model(req.model)
        self.check_n(req.n)
        self.check_stream_options(req.stream, req.stream_options)
        prompt_ids, params, mode = await self.prepare(req)
        ids = ResponseIds.new("chatcmpl", model, req.request_id)
        echo = req.messages[-1].text() if req.echo and req.messages[-1].role == "assistant" else ""
        stream = await self.submit(ids.id, prompt_ids, params, req.cache_salt)
        if req.stream:
            return SSEResponse(self._stream(req, ids, stream, mode, echo, prompt_ids), [stream])
        output = await self.final_output(stream)
        k = ALL if req.logprob_token_ids else req.top_logprobs or 0
        choices = []
        for c in output.outputs:
            reasoning, content, calls = self.parse_reply(req, mode, c.text)
            logprobs = None
            if req.logprobs:
                tokens = chat_logprobs(self.logprobs_tokenizer(req), c.token_ids, c.logprobs or [], k)
                logprobs = ChatChoiceLogprobs(content=tokens)
            choices.append(
                ChatCompletionChoice(
                    index=c.index,
                    message=ChatResponseMessage(
                        content=echo + content if content is not None else (echo or None),
                        reasoning_content=reasoning,
                        tool_calls=[call.to_openai() for call in calls],
                    ),
                    logprobs=logprobs,
                    finish_reason="tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason,
                    stop_reason=c.stop_reason,
                    token_ids=list(c.token_ids) if req.return_token_ids else None,
                )
            )
        response = ChatCompletionResponse(
            id=ids.id,
            created=ids.created,
            model=ids.model,
            choices=choices,
            usage=self.usage([output]),
            prompt_logprobs=prompt_logprobs(output.prompt_logprobs),
        )
        exclude: dict[str, Any] = {} if output.prompt_logprobs is not None else {"prompt_logprobs": True}
        if req.return_token_ids:
            response.prompt_token_ids = list(output.prompt_token_ids)
        else:
            exclude |= {"prompt_token_ids": True, "choices": {"__all__": {"token_ids"}}}
        return JSONResponse(response.model_dump(exclude=exclude))

    def parse_reply(self, req: ChatCompletionRequest, mode: ToolMode, text: str) -> tuple[str | None, str | None, list]:
        """A finished reply's reasoning (with ``--reasoning-parser`` and ``include_reasoning``), content and tool
        calls (``ToolCall``s, by the tool mode and ``--tool-call-parser``)."""
        tool_parser, reasoning_parser = self.parsers()
        reasoning = None
        if reasoning_parser is not None:
            split = reasoning_parser.split(text)
            reasoning, text = split.reasoning if req.include_reasoning else None, split.content or ""
        content, calls = mode.calls(text, tool_parser)
        return reasoning, content, calls

    async def prepare(self, req: ChatCompletionRequest) -> tuple[list[int], SamplingParams, ToolMode]:
        """The prompt's token ids (the messages rendered by the chat template, truncated as asked and checked
        against the context), the sampling parameters and the tool mode of a chat request."""
        if req.continue_final_message and req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
            raise bad_request(
                "continue_final_message continues the last assistant message, so no generation prompt can follow: "
                "drop 'add_generation_prompt': true.",
                param="add_generation_prompt",
            )
        mode = tool_mode(req, self.config.enable_auto_tool_choice)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        _, prompt_ids = await self.render_chat(
            req.messages,
            req.add_generation_prompt,
            req.continue_final_message,
            tools=tools,
            template_kwargs=template_kwargs(req),
            add_special_tokens=req.add_special_tokens,
        )
        prompt_ids = self.truncate_prompt(prompt_ids, req.truncate_prompt_tokens, req.truncation_side)
        self.check_prompt_length(len(prompt_ids), "messages")
        return prompt_ids, self._params(req, len(prompt_ids), mode), mode

    async def _stream(
        self,
        req: ChatCompletionRequest,
        ids: ResponseIds,
        stream: RequestStream,
        mode: ToolMode,
        echo: str,
        prompt_ids: list[int],
    ) -> AsyncIterator[str]:
        num_prompt_tokens = len(prompt_ids)
        n = req.n
        k = ALL if req.logprob_token_ids else req.top_logprobs or 0
        sent_chars = [0] * n
        sent_tokens = [0] * n
        num_calls = [0] * n
        done = [False] * n
        parsers = [self.parsers() for _ in range(n)]
        reasoning_streams = [ReasoningStream(r) if r is not None else None for _, r in parsers]
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous_usage = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        base = ids.chunk_base("chat.completion.chunk")
        last = None

        def chunk(choice: dict, prompt_token_ids: list[int] | None = None) -> str:
            data = {**base, "choices": [choice]}
            if prompt_token_ids is not None:
                data["prompt_token_ids"] = prompt_token_ids
            if continuous_usage:  # the role chunks come before any output: the prompt alone (as vLLM's)
                usage = (
                    self.usage([last])
                    if last is not None
                    else UsageInfo(prompt_tokens=num_prompt_tokens, total_tokens=num_prompt_tokens)
                )
                data["usage"] = usage.model_dump()
            elif include_usage:
                data["usage"] = None
            return sse(data)

        try:
            # OpenAI's first chunk of each choice carries the role and an empty content (vLLM's echo: the text).
            for i in range(n):
                first = {"index": i, "delta": {"role": "assistant", "content": echo}, "logprobs": None,
                         "finish_reason": None}  # fmt: skip
                # vLLM's return_token_ids: the prompt's ids on the first chunk only
                yield chunk(first, prompt_ids if req.return_token_ids and i == 0 else None)
            async for output in stream:
                last = output
                for c in output.outputs:
                    i = c.index
                    if done[i]:
                        continue
                    finished = c.finish_reason is not None
                    new_ids = c.token_ids[sent_tokens[i] :]
                    logprobs = None
                    if req.logprobs and new_ids:
                        positions = (c.logprobs or [])[sent_tokens[i] : len(c.token_ids)]
                        content = chat_logprobs(self.logprobs_tokenizer(req), new_ids, positions, k)
                        logprobs = {"content": [t.model_dump() for t in content]}
                    sent_tokens[i] = len(c.token_ids)
                    tool_parser, reasoning = parsers[i][0], reasoning_streams[i]
                    delta = self.stream_delta(c.text, finished, sent_chars, i, mode, tool_parser, reasoning)
                    if not req.include_reasoning:
                        delta.pop("reasoning_content", None)
                    calls = delta.pop("tool_calls", [])
                    if calls:
                        delta["tool_calls"] = [call.to_openai(num_calls[i] + j) for j, call in enumerate(calls)]
                        num_calls[i] += len(calls)
                    if not delta and logprobs is None and not finished and not (req.return_token_ids and new_ids):
                        continue
                    if finished:
                        done[i] = True
                    reason = c.finish_reason
                    if finished and num_calls[i] and reason == "stop":
                        reason = "tool_calls"
                    choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason,
                              "stop_reason": c.stop_reason}  # fmt: skip
                    if req.return_token_ids:
                        choice["token_ids"] = list(new_ids)
                    yield chunk(choice)
            if include_usage and last is not None:
                yield sse({**base, "choices": [], "usage": self.usage([last]).model_dump()})
            yield SSE_DONE
        except Exception as exc:  # headers are sent: report in-band, never drop the connection silently
            yield error_event(exc)
            yield SSE_DONE
        finally:
            stream.abort()

    @staticmethod
    def stream_delta(
        text: str,
        finished: bool,
        sent_chars: list[int],
        i: int,
        mode: ToolMode,
        tool_parser: ToolParser | None,
        reasoning: ReasoningStream | None,
    ) -> dict:
        """One choice's delta: reasoning, then content or tool calls, from its whole text so far."""
        delta: dict = {}
        if reasoning is not None:
            thought, text_delta = reasoning.delta(text, finished)
            if thought:
                delta["reasoning_content"] = thought
            text = reasoning.parser.split(text).content or ""
            if finished and not text and text_delta:  # held back as a possible tag, but the reply ended
                text = text_delta
        if mode.kind in ("required", "named"):  # the reply is the calls' JSON: sent whole at the end
            if finished:
                content, calls = mode.calls(text, None)
                if content:
                    delta["content"] = content
                delta["tool_calls"] = calls
            return delta
        if mode.kind == "auto" and tool_parser is not None:
            parsed = tool_parser.stream(text, finished)
            if parsed.content:
                delta["content"] = parsed.content
            if parsed.tool_calls:
                delta["tool_calls"] = parsed.tool_calls if mode.parallel else parsed.tool_calls[:1]
            return delta
        if len(text) > sent_chars[i] or (not finished and not delta):
            new = text[sent_chars[i] :]
            sent_chars[i] = len(text)
            if new:
                delta["content"] = new
        return delta
