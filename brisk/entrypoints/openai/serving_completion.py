"""``POST /v1/completions``: one engine request per prompt, choices numbered ``prompt_index * n + i``. A list of
prompts is tokenized in one call and handed to the engine as one batch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import JSONResponse, Response

from brisk.entrypoints.openai.errors import bad_request
from brisk.entrypoints.openai.logprobs import ALL, completion_logprobs, prompt_logprobs
from brisk.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from brisk.entrypoints.openai.serving_engine import (
    SSE_DONE,
    OpenAIServing,
    ResponseIds,
    SSEResponse,
    error_event,
    merge_streams,
    requested_prompt_logprobs,
    sse,
)
from brisk.outputs import RequestOutput
from brisk.sampling_params import SamplingParams


@dataclass
class _Prompt:
    text: str | None  # None until needed (token-id prompts are decoded only for echo)
    token_ids: list[int]


class OpenAIServingCompletion(OpenAIServing):
    async def _prompts(self, req: CompletionRequest) -> list[_Prompt]:
        raw = req.prompt
        if isinstance(raw, str):
            items: list[str | list[int]] = [raw]
        elif all(isinstance(t, int) for t in raw):
            items = [raw]
        else:
            items = list(raw)
        limit = self.config.max_prompts_per_request
        if len(items) > limit:
            raise bad_request(
                f"'prompt' holds {len(items)} prompts, above this server's limit of {limit} per request "
                "(--max-prompts-per-request); split them over several requests.",
                param="prompt",
            )
        texts = [item for item in items if isinstance(item, str)]
        encoded = iter(await self.encode_all(texts, req.add_special_tokens) if texts else [])
        prompts = []
        for i, item in enumerate(items):
            param = "prompt" if len(items) == 1 else f"prompt[{i}]"
            if isinstance(item, str):
                prompt = _Prompt(item, next(encoded))
            else:
                self.check_token_ids(item, param)
                prompt = _Prompt(None, list(item))
            if req.truncate_prompt_tokens is not None:
                truncated = self.truncate_prompt(prompt.token_ids, req.truncate_prompt_tokens, req.truncation_side)
                prompt = _Prompt(None, truncated)
            self.check_prompt_length(len(prompt.token_ids), param)
            prompts.append(prompt)
        return prompts

    def _params(self, req: CompletionRequest, num_prompt_tokens: int) -> SamplingParams:
        max_tokens = self.resolve_max_tokens(req.max_tokens, num_prompt_tokens, "max_tokens")
        wanted = [k for k in (requested_prompt_logprobs(req), req.logprobs if req.echo else None) if k is not None]
        return self.request_sampling_params(
            req,
            max_tokens,
            logprobs=None if req.logprob_token_ids else req.logprobs,
            prompt_logprobs=max(wanted) if wanted else None,
        )

    async def create(self, req: CompletionRequest) -> Response:
        model = self.check_model(req.model)
        self.check_n(req.n, req.best_of)
        self.check_stream_options(req.stream, req.stream_options)
        prompts = await self._prompts(req)
        params = [self._params(req, len(p.token_ids)) for p in prompts]
        if req.echo:
            for p in prompts:
                if p.text is None:
                    p.text = await self.decode(p.token_ids)
        ids = ResponseIds.new("cmpl", model, req.request_id)
        streams = await self.submit_all(
            [(f"{ids.id}-{i}", p.token_ids, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))],
            req.cache_salt,
        )

        if req.stream:
            return SSEResponse(self._stream(req, ids, prompts, streams), streams)
        try:
            outputs = await asyncio.gather(*(self.final_output(s) for s in streams))
        finally:
            for stream in streams:
                stream.abort()
        response = self._response(req, ids, prompts, outputs)
        left_out = set() if req.return_token_ids else {"prompt_token_ids", "token_ids"}
        if outputs[0].prompt_logprobs is None:
            left_out.add("prompt_logprobs")
        return JSONResponse(response.model_dump(exclude={"choices": {"__all__": left_out}}))

    def _echo_logprobs(
        self, req: CompletionRequest, prompt: _Prompt, output: RequestOutput, k: int
    ) -> CompletionLogprobs:
        positions = output.prompt_logprobs or [None] * len(prompt.token_ids)
        return completion_logprobs(self.logprobs_tokenizer(req), prompt.token_ids, positions, k, 0)

    def _response(
        self, req: CompletionRequest, ids: ResponseIds, prompts: list[_Prompt], outputs: list[RequestOutput]
    ) -> CompletionResponse:
        choices = []
        for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
            prefix = prompt.text if req.echo else ""
            for c in output.outputs:
                logprobs = None
                if req.logprobs is not None:
                    logprobs = self._echo_logprobs(req, prompt, output, req.logprobs) if req.echo else None
                    logprobs = completion_logprobs(
                        self.logprobs_tokenizer(req),
                        c.token_ids,
                        c.logprobs or [],
                        ALL if req.logprob_token_ids else req.logprobs,
                        len(prefix or ""),
                        logprobs,
                    )
                choices.append(
                    CompletionChoice(
                        index=i * req.n + c.index,
                        text=(prefix or "") + c.text,
                        logprobs=logprobs,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                        prompt_token_ids=prompt.token_ids if req.return_token_ids else None,
                        token_ids=list(c.token_ids) if req.return_token_ids else None,
                        prompt_logprobs=prompt_logprobs(output.prompt_logprobs),
                    )
                )
        return CompletionResponse(
            id=ids.id, created=ids.created, model=ids.model, choices=choices, usage=self.usage(outputs)
        )

    async def _stream(
        self, req: CompletionRequest, ids: ResponseIds, prompts: list[_Prompt], streams: list
    ) -> AsyncIterator[str]:
        n = req.n
        num_choices = len(prompts) * n
        sent_chars = [0] * num_choices
        sent_tokens = [0] * num_choices
        offsets = [0] * num_choices
        done = [False] * num_choices
        last: dict[int, RequestOutput] = {}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous_usage = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        base = ids.chunk_base("text_completion")
        try:
            async for i, output in merge_streams(streams):
                last[i] = output
                for c in output.outputs:
                    idx = i * n + c.index
                    if done[idx]:
                        continue
                    text = c.text[sent_chars[idx] :]
                    new_ids = c.token_ids[sent_tokens[idx] :]
                    logprobs = None
                    first = sent_tokens[idx] == 0 and sent_chars[idx] == 0
                    if req.echo and first:
                        text = (prompts[i].text or "") + text
                    if req.logprobs is not None:
                        if req.echo and first:
                            logprobs = self._echo_logprobs(req, prompts[i], output, req.logprobs)
                            offsets[idx] = len(prompts[i].text or "")
                        positions = (c.logprobs or [])[sent_tokens[idx] : len(c.token_ids)]
                        k = ALL if req.logprob_token_ids else req.logprobs
                        logprobs = completion_logprobs(
                            self.logprobs_tokenizer(req), new_ids, positions, k, offsets[idx], logprobs
                        )
                        offsets[idx] += sum(len(t) for t in logprobs.tokens[-len(new_ids) :]) if new_ids else 0
                    sent_chars[idx] = len(c.text)
                    sent_tokens[idx] = len(c.token_ids)
                    if not text and not new_ids and c.finish_reason is None:
                        continue
                    if c.finish_reason is not None:
                        done[idx] = True
                    choice = {
                        "index": idx,
                        "text": text,
                        "logprobs": logprobs.model_dump() if logprobs is not None else None,
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                    }
                    if req.return_token_ids:  # vLLM: the prompt's ids on a choice's first chunk, then new ids
                        choice["prompt_token_ids"] = prompts[i].token_ids if first else None
                        choice["token_ids"] = list(new_ids)
                    chunk = {**base, "choices": [choice]}
                    if continuous_usage:
                        chunk["usage"] = self.usage([last[j] for j in sorted(last)]).model_dump()
                    elif include_usage:
                        chunk["usage"] = None
                    yield sse(chunk)
            if include_usage:
                usage = self.usage([last[i] for i in sorted(last)])
                yield sse({**base, "choices": [], "usage": usage.model_dump()})
            yield SSE_DONE
        except Exception as exc:  # headers are sent: report in-band, never drop the connection silently
            yield error_event(exc)
            yield SSE_DONE
        finally:
            for stream in streams:
                stream.abort()
