"""Real uvicorn servers on loopback ephemeral ports, one per configuration, shared by the session.

- `fake`: the server over a real LLMEngine whose model is the deterministic fake of
  fake_engine.py (scripted outputs for tool calls, stops, thinking; FOREVER for disconnects).
- `keyed`: the same engine behind an API key and a 64 KiB body cap.
- `real`: the tiny random checkpoint (`ninfer make-tiny` layout) built through ninfer.startup,
  the path `ninfer serve` takes.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .fake_engine import make_fake_engine

MODEL = "fake-qwen"
API_KEY = "test-key-0123456789"
BODY_CAP = 64 * 1024


class LogSink(io.TextIOBase):
    """The request log, kept as parsed lines (written from the server thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lines: list[dict[str, Any]] = []
        self._buf = ""

    def write(self, s: str) -> int:
        with self._lock:
            self._buf += s
            while "\n" in self._buf:
                line, self._buf = self._buf.split("\n", 1)
                if line.strip():
                    self.lines.append(json.loads(line))
        return len(s)

    def find(self, **match: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.lines if all(r.get(k) == v for k, v in match.items())]


@dataclass
class Served:
    url: str
    engine: Any  # AsyncEngine
    log: LogSink

    @property
    def llm(self) -> Any:
        return self.engine.engine

    @property
    def model(self) -> Any:
        return self.engine.engine.model

    def openai(self, **kw: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, timeout=30, **kw)

    def anthropic(self, **kw: Any) -> Any:
        import anthropic

        return anthropic.Anthropic(base_url=self.url, api_key=kw.pop("api_key", "none"), max_retries=0, timeout=30, **kw)

    def wait_log(self, timeout: float = 5.0, **match: Any) -> list[dict[str, Any]]:
        """Log lines matching `match`, waiting for the first (a line is written after the response)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            lines = self.log.find(**match)
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.005)

    def wait_idle(self, timeout: float = 5.0) -> dict[str, int]:
        """Engine stats once nothing runs or waits (fails the test after `timeout`)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            st = self.engine.stats()
            if st["free_slots"] == st["num_slots"] and not st["running"] and not st["waiting"] and not self.engine._streams:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not idle after {timeout}s: {st}, streams {list(self.engine._streams)}")
            time.sleep(0.005)


def _serve(engine: Any, **options: Any) -> Iterator[Served]:
    from ninfer.server.app import ServerThread, create_app

    sink = LogSink()
    app = create_app(engine, request_log=sink, **options)
    with ServerThread(app) as srv:
        yield Served(srv.url, engine, sink)


@pytest.fixture(scope="session")
def fake_engine() -> Iterator[Any]:
    from ninfer.engine import AsyncEngine

    engine = AsyncEngine(make_fake_engine(max_batch=4, max_context=512))
    yield engine
    engine.shutdown(drain=False)


@pytest.fixture(scope="session")
def fake(fake_engine: Any) -> Iterator[Served]:
    yield from _serve(fake_engine, model_id=MODEL)


@pytest.fixture(scope="session")
def keyed(fake_engine: Any) -> Iterator[Served]:
    yield from _serve(fake_engine, model_id=MODEL, api_key=API_KEY, max_request_bytes=BODY_CAP)


@pytest.fixture
def scripts(fake: Served) -> Iterator[dict[str, str]]:
    """The fake model's scripts (key -> output text), cleared after the test."""
    yield fake.model.scripts
    fake.model.scripts.clear()


@pytest.fixture
def slow(fake: Served) -> Iterator[Any]:
    """Slow the fake engine's steps to 30 ms so that a client can leave mid-generation. (At 10 ms,
    "free within two steps of the disconnect" failed once on a loaded 2-core machine: 20 ms is
    within a thread's scheduling delay there.)"""
    fake.model.step_delay = 0.03
    yield fake.model
    fake.model.step_delay = 0.0


@pytest.fixture(scope="session")
def real() -> Iterator[Served]:
    from ninfer.config import EngineConfig
    from ninfer.engine import AsyncEngine
    from ninfer.startup import build_engine
    from ninfer.testing import default_tiny_path

    config = EngineConfig(model=str(default_tiny_path()), device="cpu", max_context=256, max_batch=2)
    engine = AsyncEngine(build_engine(config))
    yield from _serve(engine)
    engine.shutdown(drain=False)
