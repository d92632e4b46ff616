"""POST /v1/messages and /v1/messages/count_tokens through the official anthropic SDK."""

from __future__ import annotations

import json

import httpx
import pytest

from .test_openai import CALL, prompt_len

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
            "required": ["city"],
        },
    }
]
OFF = {"type": "disabled"}
ON = {"type": "enabled", "budget_tokens": 1024}


def sse_events(url: str, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    """(event name, data) of a raw SSE response, checking that each event's name matches its type."""
    out = []
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=headers or {}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                out.append((name, data))
    return out


def check_order(events: list[tuple[str, dict]]) -> list[dict]:
    """The documented grammar; returns the blocks rebuilt from the deltas."""
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    blocks: list[dict] = []
    open_index = None
    for name, data in events[1:-2]:
        if name == "ping":
            continue
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            assert data["index"] == open_index
            d, b = data["delta"], blocks[open_index]
            kind = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "tool_use"}[d["type"]]
            assert b["type"] == kind
            if kind == "tool_use":
                b["partial_json"] = b.get("partial_json", "") + d["partial_json"]
            else:
                b[kind] += d[kind]
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
        else:
            raise AssertionError(f"unexpected event {name}")
    assert open_index is None
    return blocks


def test_event_order_and_stream_equals_message(fake, scripts):
    scripts["a1"] = "Thinking hard.\n</think>\n\nThe answer is 4."
    body = {"model": "any-label", "max_tokens": 64, "messages": [{"role": "user", "content": "2+2? SCRIPT:a1"}]}
    events = sse_events(fake.url, {**body, "stream": True})
    assert [n for n, _ in events][:2] == ["message_start", "ping"]
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["model"] == "any-label"
    assert start["usage"]["input_tokens"] == prompt_len(fake, [{"role": "user", "content": "2+2? SCRIPT:a1"}])
    blocks = check_order(events)
    assert [b["type"] for b in blocks] == ["thinking", "text"]
    assert blocks[0]["thinking"] == "Thinking hard." and blocks[1]["text"] == "The answer is 4."
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}

    m = fake.anthropic().messages.create(**body)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Thinking hard." and m.content[1].text == "The answer is 4."
    assert m.stop_reason == "end_turn" and m.model == "any-label"
    assert m.usage.input_tokens == start["usage"]["input_tokens"]
    assert m.usage.output_tokens == delta["usage"]["output_tokens"] == len(fake.llm.tokenizer.encode(scripts["a1"])) + 1


def test_sdk_stream_accumulates(fake, scripts):
    scripts["a2"] = "Hmm.\n</think>\n\nHi!"
    client = fake.anthropic()
    with client.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "SCRIPT:a2"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == "Hi!"


def test_greedy_stream_equals_non_stream(fake):
    body = {"model": "m", "max_tokens": 40, "temperature": 0, "messages": [{"role": "user", "content": "Tell me a story."}]}
    # this SDK has no `temperature` argument: it travels as an extra field
    sdk_kw = {k: v for k, v in body.items() if k != "temperature"}
    m = fake.anthropic().messages.create(**sdk_kw, extra_body={"temperature": 0})
    blocks = check_order(sse_events(fake.url, {**body, "stream": True}))
    assert [(b["type"], b.get("text", b.get("thinking"))) for b in blocks] == [
        (b.type, getattr(b, "text", None) or getattr(b, "thinking", None)) for b in m.content
    ]


def test_thinking_disabled(fake, scripts):
    scripts["a3"] = "Plain answer."
    msgs = [{"role": "user", "content": "SCRIPT:a3"}]
    m = fake.anthropic().messages.create(model="m", max_tokens=50, messages=msgs, thinking=OFF)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "Plain answer."
    assert m.usage.input_tokens == prompt_len(fake, msgs, thinking=False)
    on = fake.anthropic().messages.create(model="m", max_tokens=50, messages=msgs, thinking=ON)
    assert [b.type for b in on.content] == ["thinking"]


def test_stop_reasons(fake, scripts):
    client = fake.anthropic()
    scripts["a4"] = "one two STOP three"
    m = client.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "SCRIPT:a4"}], thinking=OFF, stop_sequences=["STOP"])
    assert (m.stop_reason, m.stop_sequence, m.content[0].text) == ("stop_sequence", "STOP", "one two ")
    events = sse_events(
        fake.url,
        {"model": "m", "max_tokens": 50, "stream": True, "thinking": OFF, "stop_sequences": ["zz", "STOP"], "messages": [{"role": "user", "content": "SCRIPT:a4"}]},
    )
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
    m = client.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "FOREVER"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    m = client.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "SCRIPT:a4"}], thinking=OFF)
    assert m.stop_reason == "end_turn" and m.stop_sequence is None


def test_tool_use_round_trip(fake, scripts):
    scripts["a5"] = "Checking.\n</think>\n\nLet me look.\n\n" + CALL
    client = fake.anthropic()
    first = [{"role": "user", "content": "Weather in Paris? SCRIPT:a5"}]
    m = client.messages.create(model="m", max_tokens=200, messages=first, tools=TOOLS)
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    use = m.content[2]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    assert use.input == {"city": "Paris", "days": 3, "metric": True}

    blocks = check_order(sse_events(fake.url, {"model": "m", "max_tokens": 200, "stream": True, "tools": TOOLS, "messages": first}))
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert json.loads(blocks[2]["partial_json"]) == use.input and blocks[2]["name"] == "get_weather"

    scripts["a6"] = "Sunny."
    history = first[:1] + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "clear SCRIPT:a6"}]}]},
    ]
    m2 = client.messages.create(model="m", max_tokens=50, messages=history, tools=TOOLS, thinking=OFF)
    assert m2.stop_reason == "end_turn" and m2.content[0].text == "Sunny."
    # the same conversation as OpenAI messages renders to the same prompt
    openai_history = [
        {"role": "user", "content": "Weather in Paris? SCRIPT:a5"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "Checking.",
            "tool_calls": [{"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(use.input)}}],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "clear SCRIPT:a6"},
    ]
    openai_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}} for t in TOOLS]
    assert m2.usage.input_tokens == prompt_len(fake, openai_history, tools=openai_tools, thinking=False)


def test_tool_choice_none(fake, scripts):
    scripts["a7"] = CALL
    m = fake.anthropic().messages.create(
        model="m", max_tokens=200, messages=[{"role": "user", "content": "SCRIPT:a7"}], tools=TOOLS, tool_choice={"type": "none"}, thinking=OFF
    )
    assert m.stop_reason == "end_turn" and m.content[0].text == CALL


@pytest.mark.parametrize("thinking", [None, OFF, ON])
def test_count_tokens_equals_usage(fake, thinking):
    client = fake.anthropic()
    kw = dict(
        model="m",
        system="You are terse.",
        messages=[
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "Hi"}]},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        ],
        tools=TOOLS,
    )
    if thinking is not None:
        kw["thinking"] = thinking
    counted = client.messages.count_tokens(**kw).input_tokens
    m = client.messages.create(max_tokens=5, **kw)
    assert counted == m.usage.input_tokens > 0


def test_system_blocks_and_request_log(fake):
    r = httpx.post(
        fake.url + "/v1/messages",
        json={"model": "m", "max_tokens": 4, "system": [{"type": "text", "text": "Be kind."}], "messages": [{"role": "user", "content": "hey"}]},
    )
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    assert r.json()["id"] == rid and rid.startswith("msg_")
    (line,) = fake.wait_log(request_id=rid)
    assert line["api"] == "anthropic" and line["status"] == 200 and line["completion_tokens"] == 4


def test_models_listing_in_anthropic_shape(fake):
    page = fake.anthropic().models.list()
    assert [m.id for m in page.data] == ["fake-qwen"]
