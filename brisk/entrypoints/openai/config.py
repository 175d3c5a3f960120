"""Server-side settings that are not engine arguments (names, security, limits)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_REQUEST_BODY_BYTES = 4 << 20


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

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]
