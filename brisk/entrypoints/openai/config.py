"""Server-side settings that are not engine arguments (names, security, limits)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_REQUEST_BODY_BYTES = 4 << 20
# Stop strings: each is matched against the text after every token and held back while it could still match.
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024


@dataclass
class ServerConfig:
    served_model_names: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    chat_template: str | None = None  # a Jinja string (the CLI reads --chat-template files into it)
    max_n: int = 16
    max_tokens_limit: int | None = None  # None: only max_model_len bounds max_tokens
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_waiting_requests: int | None = 1024
    shutdown_timeout: float = 30.0
    max_prompts_per_request: int = 1024  # completions' prompt lists
    limit_concurrency: int | None = 4096  # open connections
    header_timeout: float = 10.0  # seconds for a request's headers to arrive
    body_timeout: float = 60.0  # seconds for a request's body to arrive (after its headers)
    # With requests in flight: seconds without a heartbeat from the engine process (stopped, wedged), and
    # without a completed step (a stuck loop; one CPU prefill step of 2,048 tokens can take minutes) before
    # /health answers 503.
    engine_stall_timeout: float | None = 10.0
    engine_step_timeout: float | None = 600.0
    request_timeout: float | None = None  # seconds a request may take in all (None: no limit)
    enable_auto_tool_choice: bool = False  # tool_choice "auto": parse tool calls out of the model's text
    tool_call_parser: str | None = None  # a name of tool_parsers.TOOL_PARSERS
    reasoning_parser: str | None = None  # a name of reasoning_parsers.REASONING_PARSERS
    enable_log_requests: bool = False  # log each request's id, prompt length and sampling parameters (INFO)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]
