"""A request's life on the wire: reading the body under a cap, noticing a client that left.

A generation is cancelled as soon as its client disconnects, streaming or not: the handler's task
is cancelled, which closes the engine stream, which queues the abort; the engine thread handles
queued commands before its next step, so the slot is free within one step. Disconnects are seen
by watching ASGI `receive()` for `http.disconnect` (uvicorn answers it the moment the socket
closes), not by waiting for a failed write: a request still queued or prefilling writes nothing.

SIGTERM is uvicorn's graceful shutdown (stop accepting, let in-flight responses finish, up to the
drain timeout) followed by the app's lifespan shutdown, which drains and stops the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ninfer.server.errors import too_large

T = TypeVar("T")

# After an over-limit chunked body, read and drop at most this many times the limit so that the
# 413 reaches the client instead of a reset; past it, close on it.
_DISCARD_FACTOR = 4


class ClientGone(Exception):
    """The client closed the connection before the response was complete."""


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or ApiError 413 once it passes `limit` bytes.

    Content-Length is a hint for refusing early; the count that decides is of the bytes received
    (a chunked body has no length, and a client may send more than it announced)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts: list[bytes] = []
    size = 0
    # one generator for the read and the drain: a second request.stream() raises "Stream
    # consumed" when the chunk that crossed the limit was the body's last (seen once in CI, as
    # a 500 instead of the 413)
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            async for extra in stream:
                size += len(extra)
                if size > _DISCARD_FACTOR * limit:
                    break
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Run `work`; if the client leaves first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()


class SSEResponse:
    """A text/event-stream response that stops generating the moment the client leaves.

    Three tasks: the pump (body -> socket), the disconnect watcher and a keep-alive that writes
    `keepalive` when nothing was sent for `keepalive_s` (a long prompt, a full queue), so proxies
    and clients with read timeouts do not give up on a live request. Events are written whole, so
    a keep-alive can only fall between two events.
    """

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        keepalive: bytes,
        keepalive_s: float,
        headers: dict[str, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
    ) -> None:
        self.body = body
        self.keepalive = keepalive
        self.keepalive_s = keepalive_s
        self.headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()),
        ]
        self.on_disconnect = on_disconnect
        self._last_send = 0.0
        self._done = False

    async def _send(self, send: Send, data: bytes) -> None:
        self._last_send = time.monotonic()
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _pump(self, send: Send) -> None:
        async for chunk in self.body:
            await self._send(send, chunk)
        self._done = True  # no keep-alive may follow the closing message
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _keepalive(self, send: Send) -> None:
        while not self._done:
            wait = self._last_send + self.keepalive_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            await self._send(send, self.keepalive)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        self._last_send = time.monotonic()
        pump = asyncio.ensure_future(self._pump(send))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        beat = asyncio.ensure_future(self._keepalive(send))
        gone = False
        try:
            done, _ = await asyncio.wait((pump, watcher), return_when=asyncio.FIRST_COMPLETED)
            if pump in done:
                exc = pump.exception()
                if isinstance(exc, OSError):  # uvicorn's ClientDisconnected: a write hit a closed socket
                    gone = True
                elif exc is not None:
                    raise exc
            else:
                gone = True
        finally:
            beat.cancel()
            watcher.cancel()
            if not pump.done():
                pump.cancel()
            await asyncio.gather(pump, beat, watcher, return_exceptions=True)
            # the body may be a generator that never started: close it so its cleanup runs
            aclose: Any = getattr(self.body, "aclose", None)
            if aclose is not None:
                await aclose()
        if gone and self.on_disconnect is not None:
            self.on_disconnect()
