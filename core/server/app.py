"""The HTTP server: a starlette app over one resident engine, run by uvicorn.

    serve(engine_config, host, port, api_key, model_id, default_thinking)   # `ninfer serve`
    serve_engine(engine, ...)       # the same over an engine already built
    create_app(engine, ...)         # the ASGI app (tests, embedding)

Routes: GET /health (no key needed), GET /v1/models, GET /v1/models/{id},
POST /v1/chat/completions (OpenAI), POST /v1/messages and /v1/messages/count_tokens (Anthropic).

`Gate`, the outermost layer of the app, does per request what every route needs: the API key
(constant-time compare, every route but /health), turning errors into the API's own shape (no
bad input ever reaches the client as a 500), and the request log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator
from typing import IO, Any

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ninfer.errors import UserError
from ninfer.server import anthropic_routes, openai_routes
from ninfer.server.errors import ApiError, error_response, internal, unauthorized
from ninfer.server.generation import ServerState
from ninfer.server.lifecycle import ClientGone
from ninfer.server.reqlog import RequestRecord, make_logger

log = structlog.get_logger("ninfer.server")

DEFAULT_MAX_TOKENS = 8192  # spec section 8.2 (--default-max-tokens)
# Text only (no media yet): 32 MiB is far past any prompt that fits a context.
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
DEFAULT_DRAIN_S = 120.0
KEEPALIVE_S = 5.0  # spec section 8.3: an SSE keep-alive every 5 s


class Gate:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    def _authorized(self, scope: Scope) -> bool:
        key = self.state.api_key
        if key is None:
            return True
        ok = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    ok |= hmac.compare_digest(token.strip(), key)
            elif name == b"x-api-key":
                ok |= hmac.compare_digest(value.strip(), key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        record = RequestRecord(scope["method"], path)
        scope["ninfer.record"] = record
        started = False

        async def send_logged(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                record.status = message["status"]
            await send(message)

        err: ApiError | None = None
        try:
            if path != "/health" and not self._authorized(scope):
                err = unauthorized()
            else:
                await self.app(scope, receive, send_logged)
        except ApiError as e:
            err = e
        except UserError as e:
            err = ApiError.from_user_error(e)
        except (ClientGone, ClientDisconnect):  # ClientDisconnect: gone while the body was being read
            record.gone()
            record.status = record.status or 499  # nginx's "client closed request"
        except Exception:  # noqa: BLE001 - a bug: logged, answered with a 500, the server lives on
            log.exception("unhandled error in a request", path=path, request_id=record.request_id)
            err = internal()
        try:
            if err is not None:
                record.error_code = err.code or str(err.status)
                if not started:
                    headers = {"x-request-id": record.request_id} if record.request_id else None
                    await error_response(err, path, headers)(scope, receive, send_logged)
        finally:
            record.emit(self.state.logger)


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.ninfer
    request.scope["ninfer.record"].api = "health"
    if state.engine_alive():
        return openai_routes.json_response({"status": "ok"})
    return openai_routes.json_response({"status": "unavailable"}, status=503)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = ApiError(404, f"No route {request.method} {request.url.path}.", code="not_found")
    elif exc.status_code == 405:
        err = ApiError(405, f"{request.method} is not allowed on {request.url.path}.", code="method_not_allowed")
    else:
        err = ApiError(exc.status_code, str(exc.detail))
    record = request.scope.get("ninfer.record")
    if record is not None:
        record.error_code = err.code
    return error_response(err, request.url.path, getattr(exc, "headers", None))


def create_app(
    engine: Any,
    *,
    model_id: str | None = None,
    api_key: str | None = None,
    default_thinking: bool = True,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    drain_timeout: float = DEFAULT_DRAIN_S,
    keepalive_s: float = KEEPALIVE_S,
    request_log: IO[str] | None = None,
) -> Starlette:
    """The ASGI app over `engine`: an LLMEngine (the app owns it: it starts its AsyncEngine and
    drains and stops it at shutdown) or an AsyncEngine (shared: left running)."""
    from ninfer.engine import AsyncEngine, LLMEngine

    owned = isinstance(engine, LLMEngine)
    aengine = AsyncEngine(engine) if owned else engine
    if default_max_tokens < 1:
        raise UserError(f"The default max_tokens must be positive, got {default_max_tokens}.")
    state = ServerState(
        aengine,
        model_id=model_id or aengine.info.get("model") or "ninfer",
        api_key=api_key,
        default_thinking=default_thinking,
        default_max_tokens=default_max_tokens,
        max_request_bytes=max_request_bytes,
        keepalive_s=keepalive_s,
        logger=make_logger(request_log),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if owned:
            # uvicorn has already waited for in-flight responses; this finishes what is left
            await asyncio.to_thread(aengine.shutdown, drain=True, timeout=drain_timeout)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", openai_routes.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", openai_routes.get_model, methods=["GET"]),
        Route("/v1/chat/completions", openai_routes.chat_completions, methods=["POST"]),
        Route("/v1/messages", anthropic_routes.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic_routes.count_tokens, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Gate, state=state)],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.ninfer = state
    return app


# --- running it -----------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads so a taken port fails in a second."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port} is not a TCP port: use 0..65535 (0 picks a free one).", param="port")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto is
    # IPPROTO_TCP, and socket.create_server leaves it 0. With Nagle on, each response's second
    # write waits for the client's delayed ACK: 40 ms per keep-alive request (measured).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(f"Cannot listen on {host}:{port} ({e.strerror or e}): choose another --port or --host.") from None
    return sock


def uvicorn_server(app: Any, *, drain_timeout: float = DEFAULT_DRAIN_S) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,  # the request log replaces it
        lifespan="on",
        timeout_graceful_shutdown=drain_timeout,
        timeout_keep_alive=5,
    )
    return uvicorn.Server(config)


def serve_engine(
    engine: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    sock: socket.socket | None = None,
    drain_timeout: float = DEFAULT_DRAIN_S,
    **app_options: Any,
) -> int:
    """Serve `engine` until SIGTERM/SIGINT; then drain in-flight requests and return 0."""
    sock = sock or bind(host, port)
    app = create_app(engine, drain_timeout=drain_timeout, **app_options)
    server = uvicorn_server(app, drain_timeout=drain_timeout)
    state: ServerState = app.state.ninfer
    h, p = sock.getsockname()[:2]
    print(f"ninfer: serving {state.model_id} on http://{h}:{p} (OpenAI /v1/chat/completions, Anthropic /v1/messages)", file=sys.stderr, flush=True)
    plan = getattr(engine, "plan", None)
    if plan is not None and getattr(plan, "memory", None) is not None:
        c, m = plan.config, plan.memory.as_dict()
        print(
            f"ninfer: --quant {c.quant} on {plan.device.describe()}: {c.max_batch} sequences of up to {c.max_context} "
            f"tokens, prefill chunks of {c.prefill_chunk} ({c.prefill_chunk_busy} while others decode), "
            f"about {m['total_gib']:.1f} of {m['available_gib']:.1f} GiB planned",
            file=sys.stderr,
            flush=True,
        )
    main = threading.current_thread() is threading.main_thread()
    if main:
        # uvicorn re-raises the signal it drained on once it is done; a no-op handler in place then
        # turns a drained SIGTERM into a clean return (exit code 0) instead of death by signal.
        previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        sock.close()
    return 0


def serve(
    engine_config: Any,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    model_id: str | None = None,
    default_thinking: bool = True,
    **options: Any,
) -> int:
    """`ninfer serve`: bind, build the engine, serve until SIGTERM, drain, return the exit code.

    `options`: default_max_tokens, max_request_bytes, drain_timeout, keepalive_s, request_log
    (a text file object for the JSON request log; default stderr)."""
    from ninfer.startup import build_engine

    sock = bind(host, port)
    try:
        engine = build_engine(engine_config)
    except BaseException:
        sock.close()
        raise
    return serve_engine(
        engine,
        sock=sock,
        api_key=api_key,
        model_id=model_id,
        default_thinking=default_thinking,
        **options,
    )


class ServerThread:
    """A real uvicorn server on a loopback port in a background thread (tests, benchmarks)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, drain_timeout: float = 10.0) -> None:
        self.sock = bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn_server(app, drain_timeout=drain_timeout)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            threading.Event().wait(0.005)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
