"""The request of OpenAI's Responses API (``POST /v1/responses``), as vLLM 0.26 serves it for text models, and its
translation into a chat request: ``instructions`` become the first, system message; ``input`` (a string, or a
list of message, function-call and function-call-output items) the conversation after it, whose last assistant
message, when unfinished (``in_progress`` or ``incomplete``), the reply continues. brisk keeps no
responses (vLLM does not either, unless told to), so ``store`` is echoed as false and ``previous_response_id`` and
``background`` are refused: send the whole conversation in ``input``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from brisk.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    FunctionDefinition,
    RepetitionDetection,
    _Body,
    _Request,
)

# ``include`` values vLLM accepts: the one that asks for something (logprobs) is implemented; the others name
# outputs of tools and inputs a text model never has, so they ask for nothing here.
INCLUDE_LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = (
    INCLUDE_LOGPROBS,
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "reasoning.encrypted_content",
)


class InputTextPart(_Request):
    """A message's text part: ``input_text`` in user, system and developer messages, ``output_text`` in the
    assistant's (as a previous response's message item carries it)."""

    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


def _joined(content: str | list[InputTextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class _Item(_Request):
    """What every input item may carry from the response it came from."""

    id: str | None = None
    status: str | None = None


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputTextPart]

    def text(self) -> str:
        return _joined(self.content)


class FunctionCallItem(_Item):
    """A call the model made in an earlier turn (a previous response's output item)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None


class FunctionCallOutputItem(_Item):
    """The client's result of a call, matched to it by ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputTextPart]

    def text(self) -> str:
        return _joined(self.output)


class ReasoningItem(_Item):
    """A previous response's reasoning: accepted in ``input``, not shown to the model again (chat templates drop
    earlier turns' reasoning too)."""

    type: Literal["reasoning"]
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None


# Told apart by ``type``, so that a bad item's error names its own fields.
InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")
]


class FunctionTool(FunctionDefinition):
    """A chat tool's function, flattened (the Responses API has no ``function`` wrapper)."""

    type: Literal["function"]


class FunctionToolChoice(_Request):
    type: Literal["function"]
    name: str


class TextFormat(_Request):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Request):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Body):
    model: str | None = Field(None, description="Served model name; defaults to the (only) served model.")
    input: str | Annotated[list[InputItem], Field(min_length=1)] = Field(
        ..., description="The conversation: text, or message and call items."
    )
    instructions: str | None = Field(None, description="A system message placed before the input.")
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    include: list[str] | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice = "auto"
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    store: bool | None = Field(True, description="Accepted; brisk keeps no responses and answers store: false.")
    background: bool | None = False
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions
    request_id: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    repetition_detection: RepetitionDetection | None = None
    enable_response_messages: bool = False
    previous_input_messages: list[dict[str, Any]] | None = None
    vllm_xargs: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _typed_messages(cls, data: Any) -> Any:
        """OpenAI's shorthand message, ``{"role": ..., "content": ...}`` without a ``type``, is a message item."""
        if isinstance(data, dict) and isinstance(data.get("input"), list):
            items = [
                {**item, "type": "message"}
                if isinstance(item, dict) and "type" not in item and "role" in item
                else item
                for item in data["input"]
            ]
            data = {**data, "input": items}
        return data

    def wants_logprobs(self) -> bool:
        return INCLUDE_LOGPROBS in (self.include or [])


def chat_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages: the instructions, then the input; a call joins the assistant message
    before it (a reply and its calls are one turn), a call's output becomes a tool message."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    for item in req.input:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "content": item.text(), "tool_call_id": item.call_id})
    return messages


def to_chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that generates this response (validated like any chat request)."""
    chat: dict[str, Any] = {
        name: getattr(req, name)
        for name in (
            "model", "stream", "temperature", "top_p", "presence_penalty", "frequency_penalty", "logit_bias",
            "seed", "stop", "top_k", "min_p", "repetition_penalty", "ignore_eos", "skip_special_tokens",
            "include_stop_str_in_output", "include_reasoning", "chat_template_kwargs", "structured_outputs",
            "repetition_detection", "request_id", "priority", "cache_salt", "metadata", "user", "service_tier",
            "vllm_xargs", "kv_transfer_params", "ec_transfer_params", "media_io_kwargs", "mm_processor_kwargs",
        )
        if getattr(req, name) is not None
    }  # fmt: skip
    chat["messages"] = chat_messages(req)
    chat["max_completion_tokens"] = req.max_output_tokens
    if req.wants_logprobs():
        chat["logprobs"], chat["top_logprobs"] = True, req.top_logprobs or 0
    # "none" shows the prompt no tools (vLLM's rule here); the default "auto" without tools asks for nothing, and
    # any other choice without tools is the chat request's error.
    if req.tool_choice != "none" and (req.tools or req.tool_choice != "auto"):
        chat["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"})} for tool in req.tools]
        choice = req.tool_choice
        chat["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        )
        chat["parallel_tool_calls"] = req.parallel_tool_calls
    form = req.text.format if req.text is not None else None
    if form is not None and form.type != "text":
        schema = {"name": form.name or "response", "schema": form.json_schema, "strict": form.strict}
        chat["response_format"] = {"type": form.type, **({"json_schema": schema} if form.type == "json_schema" else {})}
    if req.reasoning is not None and req.reasoning.effort is not None:
        chat["reasoning_effort"] = req.reasoning.effort
    last = req.input[-1] if isinstance(req.input, list) else None
    if isinstance(last, MessageItem) and last.role == "assistant" and last.status in ("in_progress", "incomplete"):
        chat["continue_final_message"], chat["add_generation_prompt"] = True, False  # the reply goes on
    return ChatCompletionRequest.model_validate(chat)
