"""The app around the routes: keep-alives, engine failures, /health, the request logger."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from .conftest import MODEL, LogSink, _serve


@pytest.fixture
def pinging(fake_engine, slow):
    """A server that sends a keep-alive after 25 ms of silence, over a 60 ms-per-step engine."""
    slow.step_delay = 0.06
    yield from _serve(fake_engine, model_id=MODEL, keepalive_s=0.025)


def test_keepalives_while_idle_are_harmless(pinging):
    with httpx.stream("POST", pinging.url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "FOREVER"}], "max_tokens": 3, "stream": True}) as r:
        raw = r.read().decode()
    assert ": keep-alive\n\n" in raw
    stream = pinging.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "FOREVER"}], max_tokens=3, stream=True, stream_options={"include_usage": True})
    assert [c.usage.completion_tokens for c in stream if c.usage] == [3]
    with httpx.stream("POST", pinging.url + "/v1/messages", json={"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "FOREVER"}], "stream": True}) as r:
        raw = r.read().decode()
    assert raw.count("event: ping") >= 2  # the opening one and at least one keep-alive
    with pinging.anthropic().messages.stream(model="m", max_tokens=3, messages=[{"role": "user", "content": "FOREVER"}]) as s:
        assert s.get_final_message().usage.output_tokens == 3


def test_engine_failure_is_a_500_in_the_api_shape_and_the_server_lives_on(fake):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "EXPLODE"}], "max_tokens": 5}
    r = httpx.post(fake.url + "/v1/chat/completions", json=body)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    r = httpx.post(fake.url + "/v1/messages", json={**body, "model": "m"})
    assert r.status_code == 500 and r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    with httpx.stream("POST", fake.url + "/v1/chat/completions", json={**body, "stream": True}) as s:
        lines = [x for x in s.iter_lines() if x]
    assert json.loads(lines[-2][6:])["error"]["code"] == "internal_error" and lines[-1] == "data: [DONE]"
    with httpx.stream("POST", fake.url + "/v1/messages", json={**body, "model": "m", "stream": True}) as s:
        lines = [x for x in s.iter_lines() if x]
    assert lines[-2] == "event: error" and json.loads(lines[-1][6:])["error"]["type"] == "api_error"
    ok = fake.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ok.usage.completion_tokens == 2
    fake.wait_idle()


def test_health_says_unavailable_once_the_engine_stopped():
    from ninfer.engine import AsyncEngine

    from .fake_engine import make_fake_engine

    engine = AsyncEngine(make_fake_engine(max_batch=1, max_context=64))
    gen = _serve(engine)
    served = next(gen)
    try:
        assert httpx.get(served.url + "/health").json() == {"status": "ok"}
        engine.shutdown(drain=False)
        r = httpx.get(served.url + "/health")
        assert r.status_code == 503 and r.json() == {"status": "unavailable"}
    finally:
        gen.close()


def test_request_log_ignores_the_process_log_level():
    import structlog

    from ninfer import logs
    from ninfer.server.reqlog import RequestRecord, make_logger

    sink = LogSink()
    try:
        logs.configure("error")  # as `ninfer serve --log-level error` would
        rec = RequestRecord("GET", "/health")
        rec.status = 200
        rec.emit(make_logger(sink))
        rec.emit(make_logger(sink))  # once only
    finally:
        structlog.reset_defaults()
    (line,) = sink.lines
    assert line["path"] == "/health" and line["status"] == 200 and line["event"] == "request"


def test_create_app_owns_an_llm_engine():
    """Given an LLMEngine, the app starts its AsyncEngine and drains and stops it at shutdown."""
    from ninfer.server.app import ServerThread, create_app

    from .fake_engine import make_fake_engine

    app = create_app(make_fake_engine(max_batch=1, max_context=64), request_log=io.StringIO())
    with ServerThread(app) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "fake-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200
    assert not app.state.ninfer.engine_alive()
