"""The OpenAI-compatible HTTP server: a FastAPI app over an :class:`AsyncLLM`, served by uvicorn.

``build_app`` wires routes, error handlers and the pure-ASGI middlewares (API key outermost, then the body
size limit); ``run_server`` binds the socket, loads the engine, serves until SIGTERM/SIGINT and shuts down
gracefully (stop accepting, let in-flight requests finish within ``shutdown_timeout``, stop the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from brisk.engine.async_engine import AsyncLLM
from brisk.engine.core_process import freeze_startup_heap
from brisk.engine.metrics import CONTENT_TYPE_LATEST, EngineMetrics
from brisk.entrypoints.openai.auth import APIKeyMiddleware
from brisk.entrypoints.openai.config import ServerConfig
from brisk.entrypoints.openai.connection_guard import guarded_protocol
from brisk.entrypoints.openai.errors import OpenAIError, install_error_handlers
from brisk.entrypoints.openai.limits import BodySizeLimitMiddleware
from brisk.entrypoints.openai.openapi import openapi_document
from brisk.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from brisk.entrypoints.openai.responses_protocol import ResponsesRequest
from brisk.entrypoints.openai.serving_chat import OpenAIServingChat
from brisk.entrypoints.openai.serving_completion import OpenAIServingCompletion
from brisk.entrypoints.openai.serving_responses import OpenAIServingResponses
from brisk.entrypoints.openai.serving_tokenize import OpenAIServingTokenization

logger = logging.getLogger("brisk.server")


def with_cancellation(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Cancel a (non-streaming) handler when its client disconnects, so the engine request is aborted instead
    of computed for nobody. Streaming responses get the same from Starlette once they have started."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request: Request = kwargs["raw_request"]
        handler_task = asyncio.ensure_future(handler(*args, **kwargs))
        disconnect_task = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait([handler_task, disconnect_task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect_task.cancel()
            if not handler_task.done():
                handler_task.cancel()
        if handler_task.done() and not handler_task.cancelled():
            return handler_task.result()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await handler_task  # let its cleanup (abort) run
        return Response(status_code=499)  # the client is gone; nobody reads this

    return wrapper


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def build_app(engine: AsyncLLM, config: ServerConfig, metrics: EngineMetrics | None = None) -> FastAPI:
    tokenizer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brisk-tokenizer")
    completions = OpenAIServingCompletion(engine, config, tokenizer_pool)
    chat = OpenAIServingChat(engine, config, tokenizer_pool)
    responses = OpenAIServingResponses(chat)
    tokenization = OpenAIServingTokenization(engine, config, tokenizer_pool)
    metrics = metrics if metrics is not None else engine.metrics

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            await engine.shutdown()
            tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    from brisk import __version__

    app = FastAPI(
        title="brisk",
        summary="OpenAI-compatible API of the brisk inference engine.",
        version=__version__,
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.openapi = functools.cache(lambda: openapi_document(app, config, engine.max_model_len, engine.vocab_size))
    app.state.engine = engine
    app.state.config = config
    created = int(time.time())

    @app.post("/v1/completions", response_model=CompletionResponse)
    @with_cancellation
    async def create_completion(body: CompletionRequest, raw_request: Request) -> Response:
        """Text completions; ``stream: true`` answers server-sent events ending in ``data: [DONE]``."""
        return await completions.create(body)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse)
    @with_cancellation
    async def create_chat_completion(body: ChatCompletionRequest, raw_request: Request) -> Response:
        """Chat completions (the model's chat template renders the messages)."""
        return await chat.create(body)

    @app.post("/v1/responses")
    @with_cancellation
    async def create_response(body: ResponsesRequest, raw_request: Request) -> Response:
        """OpenAI's Responses API (text and function calls); ``stream: true`` answers its named events."""
        return await responses.create(body)

    @app.get("/v1/responses/{response_id}")
    @app.post("/v1/responses/{response_id}/cancel")
    async def stored_response(response_id: str) -> Response:
        """brisk keeps no responses (vLLM keeps none either, unless told to): every id is unknown."""
        raise OpenAIError(
            f"Response with id '{response_id}' not found: brisk keeps no responses.", status_code=404, code="not_found"
        )

    def _card(name: str) -> ModelCard:
        return ModelCard(id=name, created=created, root=config.model_name, max_model_len=engine.max_model_len)

    @app.get("/v1/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return ModelList(data=[_card(name) for name in config.served_model_names])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard)
    async def get_model(model_id: str) -> ModelCard:
        if model_id not in config.served_model_names:
            raise OpenAIError(f"The model '{model_id}' does not exist.", status_code=404, code="model_not_found")
        return _card(model_id)

    @app.post("/tokenize", response_model=TokenizeResponse)
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        """Token ids of a prompt, or of messages rendered with the chat template."""
        return await tokenization.tokenize(body)

    @app.post("/detokenize", response_model=DetokenizeResponse)
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await tokenization.detokenize(body)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        """200 while the engine loop runs and keeps up; 503 when it is not running, or is stalled (requests in
        flight and no heartbeat within --engine-stall-timeout, or no step within --engine-step-timeout). Never
        needs the API key."""
        stalled = engine.stall_reason()
        if not engine.is_alive:
            message = "The engine loop is not running."
        elif stalled is not None:
            message = stalled
        else:
            return JSONResponse({"status": "ok"})
        return OpenAIError(message, status_code=503, code="engine_unavailable").to_response()

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus text exposition of the ``brisk:`` metrics."""
        body = metrics.render() if metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    # Pure ASGI middlewares; the last added is the outermost: the key is checked before any body is read.
    app.add_middleware(
        BodySizeLimitMiddleware, max_body_bytes=config.max_request_body_bytes, body_timeout=config.body_timeout
    )
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key)
    return app


# ------------------------------------------------------------------------------------------
# running it


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def security_warning(host: str, api_key: str | None) -> str | None:
    """The loud warning for a server reachable beyond this machine without an API key (None if fine)."""
    if api_key or is_loopback(host):
        return None
    banner = "!" * 100
    return (
        f"\n{banner}\nSERVING ON {host} WITHOUT AN API KEY: anyone who can reach this address can use the "
        f"model.\nSet --api-key (or BRISK_API_KEY), or bind to 127.0.0.1.\n{banner}"
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a busy port fails in a second, not after the weights load."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from exc
    sock.set_inheritable(True)
    return sock


def open_file_limit(max_connections: int | None) -> int | None:
    """Raise this process's open-file limit to its hard limit, and return the connection cap that fits under
    it (each connection is a file descriptor; the rest of the server needs some too)."""
    import resource

    reserve = 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if max_connections is None or soft == resource.RLIM_INFINITY or max_connections + reserve <= soft:
        return max_connections
    fitted = max(soft - reserve, 16)
    logger.warning(
        "--limit-concurrency %d does not fit the open-file limit of %d: serving at most %d connections "
        "(raise the limit with ulimit -n)",
        max_connections,
        soft,
        fitted,
    )
    return fitted


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def _end_in_flight_after(engine: AsyncLLM, seconds: float) -> None:
    await asyncio.sleep(seconds)
    if engine.num_in_flight:
        logger.warning("Shutdown timeout: ending the %d requests still in flight", engine.num_in_flight)
    await engine.shutdown()


def run_server(engine_args: Any, config: ServerConfig, *, uvicorn_log_level: str = "info", access_log: bool = True):
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    warning = security_warning(config.host, config.api_key)
    if warning:
        logger.warning("%s", warning)
    sock = bind_socket(config.host, config.port)
    port = sock.getsockname()[1]
    logger.info("Loading model %s", engine_args.model)
    started = time.time()
    metrics = EngineMetrics(config.model_name)
    limit_concurrency = open_file_limit(config.limit_concurrency)
    engine = AsyncLLM.from_engine_args(
        engine_args,
        max_waiting_requests=config.max_waiting_requests,
        metrics=metrics,
        stall_timeout_s=config.engine_stall_timeout,
        step_timeout_s=config.engine_step_timeout,
    )
    metrics.watch_heartbeat(engine)
    logger.info(
        "Engine ready in %.1f s: max_model_len=%d, served as %s",
        time.time() - started,
        engine.max_model_len,
        ", ".join(config.served_model_names),
    )
    app = build_app(engine, config, metrics)
    frozen = freeze_startup_heap()  # this process streams every response: no collector pauses in it either
    logger.debug("%d start-up objects frozen in the engine process, %d here", engine.engine_gc_frozen_objects, frozen)
    uv_config = uvicorn.Config(
        app,
        log_level=uvicorn_log_level,
        access_log=access_log,
        # uvicorn's own deadline only backs ours up: at shutdown_timeout we end what is left ourselves, so
        # clients get an error event / 503 and a clean end rather than a cut connection.
        timeout_graceful_shutdown=config.shutdown_timeout + 5,
        timeout_keep_alive=5,
        http=guarded_protocol(limit_concurrency, config.header_timeout),
    )
    url = _url(config.host, port)

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                logger.info(
                    "brisk is ready to serve %s at %s/v1 (API key %s; docs at %s/docs)",
                    config.model_name,
                    url,
                    "required" if config.api_key else "not required",
                    url,
                )

        def _log_started_message(self, listeners: Any) -> None:
            pass  # we log our own, with the right URL

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if engine.num_in_flight:
                logger.info(
                    "Shutting down: %d requests in flight get up to %.0f s to finish",
                    engine.num_in_flight,
                    config.shutdown_timeout,
                )
            deadline = asyncio.ensure_future(_end_in_flight_after(engine, config.shutdown_timeout))
            try:
                await super().shutdown(sockets=sockets)
            finally:
                deadline.cancel()

    server = _Server(uv_config)
    # uvicorn re-raises the signal that stopped it once it is done; a no-op handler makes a graceful SIGTERM
    # shutdown exit with status 0 (SIGINT keeps Python's KeyboardInterrupt, i.e. status 130).
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    logger.info("brisk server stopped")
    return 0
