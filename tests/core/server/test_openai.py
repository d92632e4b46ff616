"""POST /v1/chat/completions and /v1/models through the official openai SDK."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import MODEL

USER = [{"role": "user", "content": "Tell me about the sea."}]
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
                "required": ["city"],
            },
        },
    }
]
CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>"
)


def collect(stream):
    """(role, reasoning, content, tool_calls, finish_reason, usage, chunks) of a chat stream."""
    role = None
    reasoning, content, calls, finish, usage, chunks = [], [], [], None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            role = role or d.role
            r = getattr(d, "reasoning_content", None)
            if r:
                reasoning.append(r)
            if d.content:
                content.append(d.content)
            for tc in d.tool_calls or ():
                calls.append(tc)
            if choice.finish_reason:
                finish = choice.finish_reason
    return role, "".join(reasoning), "".join(content), calls, finish, usage, chunks


def prompt_len(served, messages, tools=None, thinking=True) -> int:
    text = served.llm.chat.render(messages, tools=tools, enable_thinking=thinking)
    return len(served.llm.tokenizer.encode(text))


def test_models(fake):
    client = fake.openai()
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    r = httpx.get(fake.url + "/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("seed", [1, 7])
def test_stream_equals_non_stream_for_same_seed(fake, seed):
    client = fake.openai()
    kw = dict(model=MODEL, messages=USER, seed=seed, temperature=1.0, max_tokens=60)
    full = client.chat.completions.create(**kw)
    role, reasoning, content, calls, finish, usage, chunks = collect(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    msg = full.choices[0].message
    assert role == "assistant"
    assert reasoning == msg.reasoning_content and reasoning
    assert content == msg.content and content
    assert not calls and msg.tool_calls is None
    assert finish == full.choices[0].finish_reason == "stop"
    assert usage.prompt_tokens == full.usage.prompt_tokens == prompt_len(fake, USER)
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # the usage chunk comes last, with no choices; every chunk carries the same id
    assert chunks[-1].choices == [] and len({c.id for c in chunks}) == 1


def test_seed_changes_sampled_answer(fake):
    client = fake.openai()
    answers = {
        client.chat.completions.create(model=MODEL, messages=USER, seed=s, temperature=1.0, max_tokens=60).choices[0].message.content
        for s in range(6)
    }
    assert len(answers) > 1


def test_usage_counts_are_exact(fake, scripts):
    scripts["exact"] = "one two three"
    msgs = [{"role": "user", "content": "SCRIPT:exact"}]
    r = fake.openai().chat.completions.create(model=MODEL, messages=msgs, max_tokens=50, extra_body={"enable_thinking": False})
    ids = fake.llm.tokenizer.encode("one two three")
    assert r.choices[0].message.content == "one two three"
    assert r.usage.prompt_tokens == prompt_len(fake, msgs, thinking=False)
    assert r.usage.completion_tokens == len(ids) + 1  # the withheld <|im_end|> counts
    assert r.choices[0].finish_reason == "stop"


def test_stream_without_usage_has_no_usage_chunk(fake):
    lines = []
    with httpx.stream("POST", fake.url + "/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True, "max_tokens": 30}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert all("usage" not in e for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and events[-1]["choices"][0]["delta"] == {}


def test_reasoning_is_a_separate_channel(fake, scripts):
    scripts["think"] = "I should greet.\n</think>\n\nHello there!"
    client = fake.openai()
    msgs = [{"role": "user", "content": "SCRIPT:think"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=50)
    assert r.choices[0].message.reasoning_content == "I should greet."
    assert r.choices[0].message.content == "Hello there!"
    _, reasoning, content, _, _, _, chunks = collect(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=50, stream=True))
    assert (reasoning, content) == ("I should greet.", "Hello there!")
    for c in chunks:  # never both channels in one delta
        d = c.choices[0].delta
        assert not (getattr(d, "reasoning_content", None) and d.content)


@pytest.mark.parametrize(
    "switch",
    [
        {"enable_thinking": False},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"reasoning_effort": "none"},
    ],
)
def test_thinking_off(fake, scripts, switch):
    scripts["plain"] = "Just the answer."
    msgs = [{"role": "user", "content": "SCRIPT:plain"}]
    r = fake.openai().chat.completions.create(model=MODEL, messages=msgs, max_tokens=50, extra_body=switch)
    assert r.choices[0].message.content == "Just the answer."
    assert r.choices[0].message.reasoning_content is None
    assert r.usage.prompt_tokens == prompt_len(fake, msgs, thinking=False)
    # the prompt closed the think block: nothing the model says is reasoning
    on = fake.openai().chat.completions.create(model=MODEL, messages=msgs, max_tokens=50)
    assert on.choices[0].message.reasoning_content == "Just the answer." and not on.choices[0].message.content
    assert on.usage.prompt_tokens == prompt_len(fake, msgs) != r.usage.prompt_tokens


def test_history_with_reasoning_content_and_preserve_thinking(fake):
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "The user greets me."},
        {"role": "user", "content": "Again"},
    ]
    client = fake.openai()
    plain = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5)
    kept = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, extra_body={"chat_template_kwargs": {"preserve_thinking": True}})
    assert plain.usage.prompt_tokens == prompt_len(fake, msgs)
    assert kept.usage.prompt_tokens > plain.usage.prompt_tokens  # the old reasoning is rendered back


def test_message_shapes_accepted(fake):
    msgs = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "part two"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = fake.openai().chat.completions.create(model=MODEL, messages=msgs, tools=WEATHER, max_tokens=20, stop=["zzz"])
    assert r.usage.prompt_tokens == prompt_len(fake, msgs, tools=WEATHER)


def test_max_tokens_and_length_finish(fake):
    client = fake.openai()
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "FOREVER"}], max_completion_tokens=7)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "FOREVER"}], max_tokens=5)
    assert r.usage.completion_tokens == 5
    _, _, _, _, finish, usage, _ = collect(
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "FOREVER"}], max_tokens=4, stream=True, stream_options={"include_usage": True})
    )
    assert finish == "length" and usage.completion_tokens == 4


def test_default_budget_fills_the_context(fake):
    r = fake.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "FOREVER"}], extra_body={"enable_thinking": False}, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == fake.llm.max_context


def test_stop_strings(fake, scripts):
    scripts["stops"] = "alpha beta END gamma"
    msgs = [{"role": "user", "content": "SCRIPT:stops"}]
    client = fake.openai()
    kw = dict(model=MODEL, messages=msgs, max_tokens=50, extra_body={"enable_thinking": False})
    r = client.chat.completions.create(**kw, stop="END")
    assert r.choices[0].message.content == "alpha beta " and r.choices[0].finish_reason == "stop"
    _, _, content, _, finish, _, _ = collect(client.chat.completions.create(**kw, stop=["nope", "END"], stream=True))
    assert content == "alpha beta " and finish == "stop"


def test_tool_call_round_trip(fake, scripts):
    scripts["call"] = "Let me check.\n</think>\n\nI will look it up.\n\n" + CALL
    client = fake.openai()
    msgs = [{"role": "user", "content": "Weather in Paris? SCRIPT:call"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=WEATHER, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == "Let me check."
    assert choice.message.content == "I will look it up."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    # typed by the schema: string, integer, boolean
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3, "metric": True}

    # the same, streamed: one tool_calls delta with the whole call
    _, reasoning, content, calls, finish, _, _ = collect(
        client.chat.completions.create(model=MODEL, messages=msgs, tools=WEATHER, max_tokens=100, stream=True)
    )
    assert (reasoning, content, finish) == ("Let me check.", "I will look it up.", "tool_calls")
    (sc,) = calls
    assert sc.index == 0 and sc.function.name == "get_weather"
    assert json.loads(sc.function.arguments) == json.loads(call.function.arguments)

    # round trip: the call and its result go back as history
    scripts["answer"] = "It is sunny in Paris."
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "I will look it up.", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"} SCRIPT:answer'},
    ]
    r2 = client.chat.completions.create(model=MODEL, messages=history, tools=WEATHER, max_tokens=100, extra_body={"enable_thinking": False})
    assert r2.choices[0].message.content == "It is sunny in Paris." and r2.choices[0].finish_reason == "stop"
    assert r2.usage.prompt_tokens == prompt_len(fake, history, tools=WEATHER, thinking=False)


def test_two_tool_calls_streamed_with_indexes(fake, scripts):
    scripts["two"] = CALL + "\n" + CALL.replace("Paris", "Rome")
    _, _, content, calls, finish, _, _ = collect(
        fake.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "SCRIPT:two"}], tools=WEATHER, max_tokens=200, stream=True, extra_body={"enable_thinking": False}
        )
    )
    assert content == "" and finish == "tool_calls"
    assert [c.index for c in calls] == [0, 1]
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert calls[0].id != calls[1].id


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",  # unclosed parameter
        "<tool_call>\n<function=bad name!>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n</function>\n</tool_call> trailing words",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n__import__('os').system('echo pwned')\n</parameter>\n</function>",
    ],
)
def test_malformed_tool_call_is_plain_content(fake, scripts, text):
    scripts["bad"] = text
    client = fake.openai()
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:bad"}], tools=WEATHER, max_tokens=200, extra_body={"enable_thinking": False})
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text
    _, _, content, calls, finish, _, _ = collect(client.chat.completions.create(**kw, stream=True))
    assert (content, calls, finish) == (text, [], "stop")


def test_arguments_are_data_never_evaluated(fake, scripts):
    evil = "__import__('os').system('touch /tmp/ninfer-pwned')"
    scripts["evil"] = CALL.replace("3", evil).replace("Paris", "{'a': (1).__class__}")
    r = fake.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "SCRIPT:evil"}], tools=WEATHER, max_tokens=200, extra_body={"enable_thinking": False}
    )
    (call,) = r.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    assert args["days"] == evil and args["city"] == "{'a': (1).__class__}"  # kept as text


def test_tool_choice_none_leaves_text_alone(fake, scripts):
    scripts["call2"] = CALL
    msgs = [{"role": "user", "content": "SCRIPT:call2"}]
    client = fake.openai()
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=WEATHER, tool_choice="none", max_tokens=200, extra_body={"enable_thinking": False})
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == CALL
    # tools are not shown to the model either
    assert r.usage.prompt_tokens == prompt_len(fake, msgs, thinking=False)
    auto = client.chat.completions.create(model=MODEL, messages=msgs, tools=WEATHER, tool_choice="auto", max_tokens=200, extra_body={"enable_thinking": False})
    assert auto.choices[0].message.tool_calls and auto.usage.prompt_tokens == prompt_len(fake, msgs, tools=WEATHER, thinking=False)


def test_no_tools_means_no_parsing(fake, scripts):
    scripts["call3"] = CALL
    r = fake.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "SCRIPT:call3"}], max_tokens=200, extra_body={"enable_thinking": False}
    )
    assert r.choices[0].message.content == CALL and r.choices[0].message.tool_calls is None


def test_unicode_across_tokens(fake, scripts):
    scripts["emoji"] = "naïve 🎉🎉 日本語テキスト done"
    r = fake.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "SCRIPT:emoji"}], max_tokens=100, extra_body={"enable_thinking": False}
    )
    assert r.choices[0].message.content == "naïve 🎉🎉 日本語テキスト done"
    _, _, content, _, _, _, _ = collect(
        fake.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "SCRIPT:emoji"}], max_tokens=100, stream=True, extra_body={"enable_thinking": False}
        )
    )
    assert content == "naïve 🎉🎉 日本語テキスト done"


def test_request_id_header_and_log_line(fake):
    r = httpx.post(fake.url + "/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 3})
    rid = r.headers["x-request-id"]
    assert r.json()["id"] == rid
    (line,) = fake.wait_log(request_id=rid)
    assert line["status"] == 200 and line["api"] == "openai" and line["stream"] is False
    assert line["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert line["completion_tokens"] == 3 and line["finish_reason"] == "length"
    for key in ("parse_ms", "queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "total_ms"):
        assert isinstance(line[key], float) and line[key] >= 0, key
    assert line["logger"] == "ninfer.server.request" and "timestamp" in line
