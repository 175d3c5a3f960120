"""What completions, chat and tokenize handlers share: model-name check, tokenization off the event loop,
length/limit checks, building ``SamplingParams``, submitting to the engine with errors translated, SSE."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse

from brisk.engine.async_engine import (
    AsyncLLM,
    EngineDeadError,
    EngineError,
    EngineStalledError,
    QueueFullError,
    RequestStream,
    RequestTimeoutError,
)
from brisk.engine.generation_defaults import SAMPLING_FIELDS
from brisk.engine.tokenizer import RESERVED_CHAT_TEMPLATE_KWARGS
from brisk.engine.tokenizer_snapshot import encode_batch
from brisk.entrypoints.openai.config import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, ServerConfig
from brisk.entrypoints.openai.errors import OpenAIError, bad_request
from brisk.entrypoints.openai.logprobs import TOKEN_IDS
from brisk.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    PromptTokensDetails,
    UsageInfo,
)
from brisk.entrypoints.openai.tool_calling import template_message
from brisk.outputs import RequestOutput
from brisk.sampling_params import RepetitionDetectionParams, SamplingParams, error_field
from brisk.structured_outputs import StructuredOutputsParams

logger = logging.getLogger("brisk.server")


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# One encoder for every event: json.dumps with non-default options builds a new encoder per call, and a stream
# at a few hundred concurrent requests sends thousands of events a second.
_SSE_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def sse(data: dict[str, Any]) -> str:
    return f"data: {_SSE_ENCODER.encode(data)}\n\n"


def sse_event(kind: str, data: dict[str, Any]) -> str:
    """A named server-sent event (the Responses API's: ``event: TYPE`` before the data)."""
    return f"event: {kind}\ndata: {_SSE_ENCODER.encode(data)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class ResponseIds:
    """What a response and each chunk of its stream carry: the id, the creation time and the model name."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str, request_id: str | None = None) -> ResponseIds:
        """A fresh id, or ``prefix-request_id`` when the client named its request (vLLM's ``request_id``)."""
        return cls(f"{prefix}-{request_id}" if request_id else random_id(prefix), int(time.time()), model)

    def chunk_base(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, config: ServerConfig, tokenizer_pool: ThreadPoolExecutor):
        """``tokenizer_pool`` must have one worker, shared by every handler: HF tokenizers are not safe to
        use from several threads at once; tokenizing off the event loop keeps long prompts from stalling
        it."""
        self.engine = engine
        self.config = config
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.default_sampling_fields = engine.default_sampling_fields
        self._tokenizer_pool = tokenizer_pool

    # ---- names and inputs -----------------------------------------------------------------------------
    def check_model(self, name: str | None) -> str:
        """The served name a request asks for; another name is a 404, as OpenAI and vLLM answer it (clients map
        404 to their not-found error)."""
        if name is None or name in self.config.served_model_names:
            return name or self.config.model_name
        served = ", ".join(repr(n) for n in self.config.served_model_names)
        raise OpenAIError(
            f"The model '{name}' does not exist. This server serves {served}.",
            status_code=404,
            param="model",
            code="model_not_found",
        )

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise bad_request("This model has no tokenizer: send prompts as token ids.", param="prompt")
        return self.tokenizer

    async def run_tokenizer(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenizer_pool, lambda: fn(*args, **kwargs))

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        tokenizer = self._require_tokenizer()
        return await self.run_tokenizer(tokenizer.encode, text, add_special_tokens=add_special_tokens)

    async def encode_all(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text, in one call to the tokenizer pool."""
        tokenizer = self._require_tokenizer()
        return await self.run_tokenizer(encode_batch, tokenizer, texts, add_special_tokens)

    async def decode(self, token_ids: list[int], skip_special: bool = False) -> str:
        tokenizer = self._require_tokenizer()
        try:
            return await self.run_tokenizer(tokenizer.decode, token_ids, skip_special_tokens=skip_special)
        except Exception as exc:  # ids the tokenizer does not know (padding rows of the embedding, ...)
            raise bad_request(f"These token ids cannot be decoded: {exc}", param="tokens") from exc

    def check_token_ids(self, token_ids: list[int], param: str = "prompt") -> None:
        vocab = self.engine.vocab_size
        if vocab is None:
            return
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"Token id {bad} in '{param}' is outside the vocabulary [0, {vocab}).", param=param)

    async def render_chat(
        self,
        messages: list[ChatMessage],
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> tuple[str, list[int]]:
        tokenizer = self._require_tokenizer()
        template = self.config.chat_template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise bad_request(
                "This model has no chat template: start the server with --chat-template, or use completions.",
                param="messages",
            )
        if continue_final_message and add_generation_prompt:
            add_generation_prompt = False
        if continue_final_message and messages[-1].role != "assistant":
            raise bad_request(
                "continue_final_message needs the last message to be an assistant message.", param="messages"
            )
        conversation = [template_message(m) for m in messages]
        clash = sorted(RESERVED_CHAT_TEMPLATE_KWARGS & set(template_kwargs or {}))
        if clash:
            raise bad_request(
                f"chat_template_kwargs cannot set {clash}: use the request's own fields.", "chat_template_kwargs"
            )

        def apply(conversation: list[dict[str, Any]]) -> str:
            return tokenizer.apply_chat_template(
                conversation,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                **(template_kwargs or {}),
            )

        def render() -> tuple[str, list[int]]:
            text = apply(conversation)
            if any("name" in entry for entry in conversation):
                unnamed = [{k: v for k, v in entry.items() if k != "name"} for entry in conversation]
                if apply(unnamed) == text:
                    raise bad_request(
                        "This model's chat template does not use message names: drop 'name' from the messages.",
                        param="messages",
                    )
            return text, tokenizer.encode(text, add_special_tokens=add_special_tokens)

        try:
            return await self.run_tokenizer(render)
        except OpenAIError:
            raise
        except Exception as exc:  # jinja errors, raise_exception() in templates ("roles must alternate", ...)
            raise bad_request(f"The chat template could not render these messages: {exc}", param="messages") from exc

    # ---- limits and sampling ------------------------------------------------------------------------------
    def check_prompt_length(self, num_prompt_tokens: int, param: str = "prompt") -> None:
        if num_prompt_tokens == 0:
            raise bad_request("The prompt is empty: give at least one token.", param=param)
        if num_prompt_tokens >= self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens, but the prompt has "
                f"{num_prompt_tokens} tokens (at least one token must be left for the completion). "
                "Shorten the prompt.",
                param=param,
                code="context_length_exceeded",
            )

    def resolve_max_tokens(self, requested: int | None, num_prompt_tokens: int, param: str) -> int:
        room = self.max_model_len - num_prompt_tokens
        limit = self.config.max_tokens_limit
        if requested is None:  # the model's recommended default, if any, else all the room there is
            default = self.default_sampling_fields.get("max_tokens")
            return min(x for x in (room, limit, default) if x is not None)
        if requested < 1:
            raise bad_request(f"'{param}' must be at least 1, got {requested}.", param=param)
        if limit is not None and requested > limit:
            raise bad_request(
                f"'{param}' is {requested}, above this server's limit of {limit} (--max-tokens-limit).",
                param=param,
            )
        if requested > room:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the prompt, {requested} for "
                f"the completion). Reduce the prompt or '{param}'.",
                param=param,
                code="context_length_exceeded",
            )
        return requested

    @staticmethod
    def check_stream_options(stream: bool, stream_options: Any) -> None:
        if stream_options is not None and not stream:
            raise bad_request("'stream_options' needs 'stream': true.", param="stream_options")

    def check_n(self, n: int, best_of: int | None = None) -> None:
        if n > self.config.max_n:
            raise bad_request(f"'n' is {n}, above this server's limit of {self.config.max_n} (--max-n).", param="n")
        if best_of is not None and best_of != n:
            raise bad_request(
                f"'best_of' ({best_of}) different from 'n' ({n}) is not supported: brisk does not rerank "
                "completions server-side.",
                param="best_of",
            )

    @staticmethod
    def check_stop_strings(stop: str | list[str] | None) -> None:
        """Every stop string is searched for after every token: bound how many, and how long."""
        strings = [stop] if isinstance(stop, str) else stop or []
        if len(strings) > MAX_STOP_STRINGS:
            raise bad_request(f"'stop' has {len(strings)} strings; at most {MAX_STOP_STRINGS} are allowed.", "stop")
        longest = max((len(s) for s in strings), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise bad_request(
                f"A stop string has {longest} characters; at most {MAX_STOP_STRING_CHARS} are allowed.", "stop"
            )

    @staticmethod
    def sampling_params(fields: dict[str, Any], param_names: dict[str, str] | None = None) -> SamplingParams:
        """``SamplingParams(**fields)`` (``None`` values mean the default), its ValueError as a 400 naming the
        request's own field (``param_names`` maps SamplingParams names to request names)."""
        kwargs = {k: v for k, v in fields.items() if v is not None}
        try:
            return SamplingParams(**kwargs)
        except ValueError as exc:
            field, rest = error_field(str(exc))
            param, message = None, str(exc)
            if field is not None:
                param = (param_names or {}).get(field, field)
                message = f"'{param}' {rest}"
            raise bad_request(message, param=param, code="invalid_value") from exc

    def request_sampling_params(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        max_tokens: int,
        param_names: dict[str, str] | None = None,
        **fields: Any,
    ) -> SamplingParams:
        """``sampling_params`` of the fields completions and chat share, ``max_tokens`` as resolved, and the
        endpoint's own ``fields`` (logprobs, ...)."""
        self.check_token_ids(req.stop_token_ids or [], "stop_token_ids")
        self.check_stop_strings(req.stop)
        check_compatibility_fields(req)
        check_vllm_extension_fields(req)
        if req.logprob_token_ids:
            self.check_token_ids(req.logprob_token_ids, "logprob_token_ids")
        repetition = None
        if req.repetition_detection is not None:
            try:
                repetition = RepetitionDetectionParams(**req.repetition_detection.model_dump())
            except ValueError as exc:
                raise bad_request(str(exc), param="repetition_detection", code="invalid_value") from None
        if req.allowed_token_ids:
            self.check_token_ids(req.allowed_token_ids, "allowed_token_ids")
        fields.setdefault("structured_outputs", structured_outputs_of(req))
        defaults = self.default_sampling_fields
        return self.sampling_params(
            dict(
                n=req.n,
                **{
                    name: defaults.get(name) if getattr(req, name) is None else getattr(req, name)
                    for name in SAMPLING_FIELDS
                },
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                ignore_eos=req.ignore_eos,
                seed=req.seed,
                presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output,
                logit_bias=req.logit_bias or None,
                bad_words=req.bad_words or None,
                allowed_token_ids=req.allowed_token_ids,
                logprob_token_ids=req.logprob_token_ids or None,
                thinking_token_budget=req.thinking_token_budget,
                repetition_detection=repetition,
                **fields,
            ),
            param_names,
        )

    def truncate_prompt(self, prompt_ids: list[int], truncate: int | None, side: str | None = None) -> list[int]:
        """``truncate_prompt_tokens`` (vLLM): keep the last N tokens (-1: as many as the context allows), or the
        first N with ``truncation_side: "right"``."""
        if truncate is None:
            return prompt_ids
        if truncate == -1:
            truncate = self.max_model_len - 1
        if truncate < 1:
            raise bad_request("'truncate_prompt_tokens' must be -1 or at least 1.", param="truncate_prompt_tokens")
        return prompt_ids[:truncate] if side == "right" else prompt_ids[-truncate:]

    # ---- the engine ---------------------------------------------------------------------------------------
    async def submit(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, cache_salt: str | None = None
    ) -> RequestStream:
        (stream,) = await self.submit_all([(request_id, prompt_ids, params)], cache_salt)
        return stream

    async def submit_all(
        self, requests: list[tuple[str, list[int], SamplingParams]], cache_salt: str | None = None
    ) -> list[RequestStream]:
        """Hand requests to the engine together (one message, one wait for all), errors as OpenAI errors. A
        ``cache_salt`` goes with each prompt (vLLM's prompt dict): the prefix cache then shares blocks only
        with requests of the same salt."""
        if self.config.enable_log_requests:
            for request_id, prompt_ids, params in requests:
                logger.info("request %s: %d prompt tokens, %s", request_id, len(prompt_ids), params)
        if cache_salt is not None:
            requests = [(i, {"prompt_token_ids": ids, "cache_salt": cache_salt}, sp) for i, ids, sp in requests]
        try:
            return await self.engine.add_requests(requests, time.time(), self.config.request_timeout)
        except ValueError as exc:
            raise bad_request(str(exc), param="prompt") from exc
        except QueueFullError as exc:
            raise OpenAIError(str(exc), status_code=503, code="server_overloaded", headers=RETRY_SOON) from exc
        except (EngineError, RequestTimeoutError) as exc:
            raise engine_error(exc) from exc

    @staticmethod
    async def final_output(stream: RequestStream) -> RequestOutput:
        last = None
        try:
            async for output in stream:
                last = output
        except (EngineError, RequestTimeoutError) as exc:
            raise engine_error(exc) from exc
        finally:
            stream.abort()  # no-op once finished; frees the request if we were cancelled
        assert last is not None
        return last

    def logprobs_tokenizer(self, req: CompletionRequest | ChatCompletionRequest) -> Any:
        """What names tokens in logprobs: the tokenizer, or token ids (``return_tokens_as_token_ids``)."""
        return TOKEN_IDS if req.return_tokens_as_token_ids else self.tokenizer

    @staticmethod
    def usage(outputs: list[RequestOutput]) -> UsageInfo:
        prompt = sum(len(o.prompt_token_ids) for o in outputs)
        completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        cached = sum(o.num_cached_tokens for o in outputs)
        return UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


def check_compatibility_fields(req: CompletionRequest | ChatCompletionRequest) -> None:
    """Fields OpenAI and vLLM clients send by default: accepted when their value asks for nothing brisk lacks."""
    if req.store:
        raise bad_request("'store': true is not supported: brisk keeps no completions.", param="store")
    if req.service_tier not in (None, "auto", "default"):
        raise bad_request(
            f"'service_tier' {req.service_tier!r} is not supported: brisk has one tier (auto).", param="service_tier"
        )
    if req.priority != 0:
        raise bad_request("'priority' is not supported: brisk serves requests first come, first served.", "priority")


def requested_prompt_logprobs(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """vLLM's ``prompt_logprobs`` for the engine: None in a stream, where only 0 is accepted and nothing returned."""
    return None if req.stream else req.prompt_logprobs


def _refuse(field: str, accepted: str, why: str) -> OpenAIError:
    return bad_request(f"'{field}' is not supported here: only {accepted} is accepted ({why}).", param=field)


def check_vllm_extension_fields(req: CompletionRequest | ChatCompletionRequest) -> None:
    """vLLM's server extensions brisk lacks: accepted when their value asks for nothing, else a 400 naming them."""
    if req.use_beam_search:
        raise _refuse("use_beam_search", "false", "brisk does not do beam search")
    if req.length_penalty != 1.0:
        raise _refuse("length_penalty", "1.0", "it only applies to beam search, which brisk does not do")
    if req.prompt_logprobs and req.stream:  # vLLM's rule: 0 is accepted in a stream, and returns nothing
        raise bad_request("'prompt_logprobs' are not available when 'stream' is true.", param="prompt_logprobs")
    if req.return_token_offsets:
        raise _refuse("return_token_offsets", "false or null", "brisk has no /render endpoints")
    if req.cache_salt is not None and not req.cache_salt:
        raise bad_request("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    for name in ("kv_transfer_params", "ec_transfer_params"):
        if getattr(req, name):
            raise _refuse(name, "null or {}", "brisk has no disaggregated serving")
    if req.vllm_xargs:
        raise _refuse("vllm_xargs", "null or {}", "brisk has no custom extensions to read them")
    if req.logprob_token_ids and (req.logprobs is None or req.logprobs is False):
        raise bad_request("'logprob_token_ids' needs 'logprobs' to be set.", param="logprob_token_ids")
    if isinstance(req, CompletionRequest):
        if req.suffix is not None:
            raise _refuse("suffix", "null", "brisk does not fill in the middle")
        if req.prompt_embeds is not None:
            raise _refuse("prompt_embeds", "null", "brisk takes text or token-id prompts")
        if req.logprob_token_ids and req.echo:
            raise bad_request("'logprob_token_ids' cannot be combined with 'echo'.", param="logprob_token_ids")
        return
    if req.chat_template is not None:
        raise _refuse("chat_template", "null", "the server's --chat-template or the model's template is used")
    if req.media_io_kwargs:
        raise _refuse("media_io_kwargs", "null or {}", "brisk serves text-only models")
    if req.mm_processor_kwargs:
        raise _refuse("mm_processor_kwargs", "null or {}", "brisk serves text-only models")
    if req.return_prompt_text:
        raise _refuse("return_prompt_text", "false or null", "brisk does not return the rendered prompt")
    if req.return_assistant_tokens_mask:
        raise _refuse("return_assistant_tokens_mask", "false", "brisk has no /render endpoints")


def structured_outputs_of(req: CompletionRequest | ChatCompletionRequest) -> StructuredOutputsParams | None:
    """``response_format`` (OpenAI) or ``structured_outputs`` (vLLM) as the engine's constraint; errors name the
    field."""
    fmt = req.response_format
    if fmt is not None and fmt.type != "text" and req.structured_outputs is not None:
        raise bad_request("Give 'response_format' or 'structured_outputs', not both.", param="structured_outputs")
    try:
        if req.structured_outputs is not None:
            param = "structured_outputs"
            return StructuredOutputsParams(**req.structured_outputs)
        param = "response_format"
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise bad_request("response_format json_schema needs 'json_schema.schema'.", param="response_format")
        return StructuredOutputsParams(json=fmt.json_schema.json_schema)
    except TypeError as exc:  # an unknown structured_outputs key
        raise bad_request(f"'{param}' has a field brisk does not know: {exc}", param=param) from None
    except ValueError as exc:
        message = str(exc).replace("StructuredOutputsParams.", f"{param}.")
        raise bad_request(message, param=param, code="invalid_value") from None


class SSEResponse(StreamingResponse):
    """Server-sent events over engine streams; the streams are aborted however the response ends (even when
    the client leaves before the first event, when the body generator never starts)."""

    def __init__(self, content: AsyncIterator[str], streams: list[RequestStream]):
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._streams = streams

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self._streams:
                stream.abort()


RETRY_SOON = {"Retry-After": "1"}


def engine_error(exc: BaseException) -> OpenAIError:
    """The answer to an engine failure: 503 when the engine cannot serve at all (dead, shut down, stalled),
    504 when the request ran past the server's request timeout, else 500."""
    if isinstance(exc, RequestTimeoutError):
        return OpenAIError(str(exc), status_code=504, code="request_timeout")
    if isinstance(exc, EngineStalledError):
        return OpenAIError(str(exc), status_code=503, code="engine_unavailable", headers=RETRY_SOON)
    if isinstance(exc, EngineDeadError):
        return OpenAIError(str(exc), status_code=503, code="engine_unavailable")
    return OpenAIError(str(exc), status_code=500, code="engine_error")


def stream_error(exc: BaseException) -> OpenAIError:
    """An error in the middle of a stream (headers already sent), as the OpenAI error to report in-band."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, (EngineError, RequestTimeoutError)):
        return engine_error(exc)
    logger.error("Unexpected error in a stream", exc_info=exc)
    return OpenAIError(f"Internal server error ({type(exc).__name__}): {exc}", status_code=500)


def error_event(exc: BaseException) -> str:
    """An error in the middle of a stream: an OpenAI-style error as an SSE event."""
    return sse(stream_error(exc).to_dict())


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as they come: yields ``(stream index, output)``."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                await queue.put((i, output))
        except BaseException as exc:  # handed to the consumer
            await queue.put((i, exc))
        else:
            await queue.put((i, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.abort()
