"""End to end on the tiny random checkpoint, built through ninfer.startup as `ninfer serve` does."""

from __future__ import annotations

import json

import httpx

from .test_anthropic import check_order, sse_events
from .test_openai import collect, prompt_len

MSGS = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Name three colours."}]


def test_models_id_is_the_checkpoint(real):
    (m,) = real.openai().models.list().data
    assert m.id == real.llm.info["model"]


def test_stream_equals_non_stream(real):
    client = real.openai()
    model = real.llm.info["model"]
    for kw in ({"temperature": 0}, {"temperature": 1.0, "seed": 11}):
        full = client.chat.completions.create(model=model, messages=MSGS, max_tokens=8, **kw)
        _, reasoning, content, _, finish, usage, _ = collect(
            client.chat.completions.create(model=model, messages=MSGS, max_tokens=8, stream=True, stream_options={"include_usage": True}, **kw)
        )
        msg = full.choices[0].message
        assert (reasoning or None, content or None) == (msg.reasoning_content, msg.content or None)
        assert finish == full.choices[0].finish_reason
        assert usage.prompt_tokens == full.usage.prompt_tokens == prompt_len(real, MSGS)
        assert usage.completion_tokens == full.usage.completion_tokens <= 8


def test_thinking_off_has_no_reasoning(real):
    r = real.openai().chat.completions.create(model=real.llm.info["model"], messages=MSGS, max_tokens=6, temperature=0, extra_body={"enable_thinking": False})
    assert r.choices[0].message.reasoning_content is None
    assert r.usage.prompt_tokens == prompt_len(real, MSGS, thinking=False)


def test_anthropic_events_and_count_tokens(real):
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "system": "You are helpful.", "messages": [{"role": "user", "content": "Name three colours."}]}
    events = sse_events(real.url, {**body, "stream": True})
    check_order(events)
    counted = httpx.post(real.url + "/v1/messages/count_tokens", json=body).json()["input_tokens"]
    assert counted == events[0][1]["message"]["usage"]["input_tokens"] == prompt_len(real, MSGS)
    m = httpx.post(real.url + "/v1/messages", json={**body, "thinking": {"type": "disabled"}}).json()
    assert m["usage"]["input_tokens"] == prompt_len(real, MSGS, thinking=False)
    assert [b["type"] for b in m["content"]] in (["text"], [])
    assert m["stop_reason"] in ("end_turn", "max_tokens")
    assert json.loads(json.dumps(m))["usage"]["output_tokens"] <= 6
