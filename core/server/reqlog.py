"""One JSON line per HTTP request: what was asked, what came back, and where the time went.

The line is written by structlog when the response is over (or the client left), whatever the
route and the outcome, so 401s, 404s and 413s are logged too. Phases, all in milliseconds:

    parse_ms    body read + validated + chat rendered + tokenized (arrival -> queued)
    queue_ms    waiting for a cache slot (engine)
    prefill_ms  prompt processing up to the first token (engine)
    decode_ms   first token -> last token (engine)
    ttft_ms     arrival -> first generated token handed to the HTTP layer
    total_ms    arrival -> response finished

The logger is its own structlog pipeline (not the process-wide level filter), so the request log
is always JSON and always on, whatever --log-level says about everything else.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any

import structlog


def make_logger(sink: IO[str] | None = None) -> Any:
    return structlog.wrap_logger(
        structlog.PrintLogger(file=sink or sys.stderr),
        # its own level filter: the process-wide one (--log-level warning) must not drop these
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
    ).bind(logger="ninfer.server.request")


class RequestRecord:
    """Filled in as the request goes; `emit` writes the line once."""

    __slots__ = (
        "request_id", "method", "path", "api", "status", "stream", "model", "prompt_tokens",
        "completion_tokens", "finish_reason", "error_code", "disconnected", "t0", "t_ready",
        "t_first", "engine_stats", "_done",
    )  # fmt: skip

    def __init__(self, method: str, path: str) -> None:
        self.t0 = time.perf_counter()
        self.method = method
        self.path = path
        self.request_id: str | None = None
        self.api: str | None = None
        self.status: int | None = None
        self.stream: bool | None = None
        self.model: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.error_code: str | None = None
        self.disconnected = False
        self.t_ready: float | None = None
        self.t_first: float | None = None
        self.engine_stats: dict[str, Any] | None = None
        self._done = False

    def ready(self) -> None:
        self.t_ready = time.perf_counter()

    def gone(self) -> None:
        """The client left before the response was complete."""
        self.disconnected = True

    def first_token(self) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()

    def emit(self, logger: Any) -> None:
        if self._done:
            return
        self._done = True
        end = time.perf_counter()

        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000.0, 3)

        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "api": self.api,
            "status": self.status,
            "stream": self.stream,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "error_code": self.error_code,
            "disconnected": self.disconnected,
            "parse_ms": ms(self.t0, self.t_ready),
            "ttft_ms": ms(self.t0, self.t_first),
            "total_ms": ms(self.t0, end),
        }
        st = self.engine_stats
        if st:
            for k in ("queue", "prefill", "decode"):
                v = st.get(f"{k}_s")
                fields[f"{k}_ms"] = None if v is None else round(v * 1000.0, 3)
            fields["decode_tok_s"] = round(st.get("decode_tok_s", 0.0), 2)
        logger.info("request", **fields)
