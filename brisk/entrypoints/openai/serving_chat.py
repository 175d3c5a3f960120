"""``POST /v1/chat/completions``: the chat template renders the messages, one engine request carries the ``n``
choices."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import JSONResponse, Response

from brisk.engine.async_engine import RequestStream
from brisk.entrypoints.openai.errors import bad_request
from brisk.entrypoints.openai.logprobs import chat_logprobs
from brisk.entrypoints.openai.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
)
from brisk.entrypoints.openai.serving_engine import (
    SSE_DONE,
    OpenAIServing,
    ResponseIds,
    SSEResponse,
    error_event,
    sse,
)
from brisk.sampling_params import SamplingParams


class OpenAIServingChat(OpenAIServing):
    def _params(self, req: ChatCompletionRequest, num_prompt_tokens: int) -> SamplingParams:
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
        return self.request_sampling_params(
            req,
            max_tokens,
            param_names={"logprobs": "top_logprobs", "max_tokens": param},
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        )

    async def create(self, req: ChatCompletionRequest) -> Response:
        model = self.check_model(req.model)
        self.check_n(req.n)
        self.check_stream_options(req.stream, req.stream_options)
        if req.continue_final_message and req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
            raise bad_request(
                "continue_final_message continues the last assistant message, so no generation prompt can follow: "
                "drop 'add_generation_prompt': true.",
                param="add_generation_prompt",
            )
        _, prompt_ids = await self.render_chat(req.messages, req.add_generation_prompt, req.continue_final_message)
        self.check_prompt_length(len(prompt_ids), "messages")
        params = self._params(req, len(prompt_ids))
        ids = ResponseIds.new("chatcmpl", model)
        stream = await self.submit(ids.id, prompt_ids, params)
        if req.stream:
            return SSEResponse(self._stream(req, ids, stream), [stream])
        output = await self.final_output(stream)
        k = req.top_logprobs or 0
        choices = [
            ChatCompletionChoice(
                index=c.index,
                message=ChatResponseMessage(content=c.text),
                logprobs=ChatChoiceLogprobs(content=chat_logprobs(self.tokenizer, c.token_ids, c.logprobs or [], k))
                if req.logprobs
                else None,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in output.outputs
        ]
        response = ChatCompletionResponse(
            id=ids.id, created=ids.created, model=ids.model, choices=choices, usage=self.usage([output])
        )
        return JSONResponse(response.model_dump())

    async def _stream(self, req: ChatCompletionRequest, ids: ResponseIds, stream: RequestStream) -> AsyncIterator[str]:
        n = req.n
        k = req.top_logprobs or 0
        sent_chars = [0] * n
        sent_tokens = [0] * n
        done = [False] * n
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        base = ids.chunk_base("chat.completion.chunk")

        def chunk(choice: dict) -> str:
            data = {**base, "choices": [choice]}
            if include_usage:
                data["usage"] = None
            return sse(data)

        last = None
        try:
            # OpenAI's first chunk of each choice carries the role and an empty content.
            for i in range(n):
                yield chunk(
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                )
            async for output in stream:
                last = output
                for c in output.outputs:
                    i = c.index
                    if done[i]:
                        continue
                    text = c.text[sent_chars[i] :]
                    new_ids = c.token_ids[sent_tokens[i] :]
                    logprobs = None
                    if req.logprobs and new_ids:
                        positions = (c.logprobs or [])[sent_tokens[i] : len(c.token_ids)]
                        content = chat_logprobs(self.tokenizer, new_ids, positions, k)
                        logprobs = {"content": [t.model_dump() for t in content]}
                    sent_chars[i] = len(c.text)
                    sent_tokens[i] = len(c.token_ids)
                    if not text and logprobs is None and c.finish_reason is None:
                        continue
                    if c.finish_reason is not None:
                        done[i] = True
                    delta = {"content": text} if text or c.finish_reason is None else {}
                    yield chunk(
                        {
                            "index": i,
                            "delta": delta,
                            "logprobs": logprobs,
                            "finish_reason": c.finish_reason,
                            "stop_reason": c.stop_reason,
                        }
                    )
            if include_usage and last is not None:
                yield sse({**base, "choices": [], "usage": self.usage([last]).model_dump()})
            yield SSE_DONE
        except Exception as exc:  # headers are sent: report in-band, never drop the connection silently
            yield error_event(exc)
            yield SSE_DONE
        finally:
            stream.abort()
