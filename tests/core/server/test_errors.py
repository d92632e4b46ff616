"""Bad input: every malformed request gets a 4xx in its API's own error shape, never a 500, and the
next request is served normally. Also the API key (401) and the body cap (413)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import httpx
import pytest

from .conftest import API_KEY, BODY_CAP, MODEL

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
OA: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
AN: dict[str, Any] = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def w(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def wo(base: dict[str, Any], key: str) -> dict[str, Any]:
    out = copy.deepcopy(base)
    del out[key]
    return out


def msg(*messages: Any) -> dict[str, Any]:
    return w(OA, messages=list(messages))


def amsg(*messages: Any) -> dict[str, Any]:
    return w(AN, messages=list(messages))


U = {"role": "user", "content": "hi"}


def nested_tool(depth: int) -> bytes:
    """A tool schema nested `depth` objects deep (too deep for json.dumps to write it)."""
    schema = b'{"a":' * depth + b"{}" + b"}" * depth
    return b'{"model": "fake-qwen", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": ' + schema + b"}}]}"


# (id, method, path, body, status, code) -- body: bytes sent as is, anything else as JSON
CASES: list[tuple[str, str, str, Any, int, str | None]] = [
    ("empty-body", "POST", CHAT, b"", 400, "invalid_json"),
    ("truncated", "POST", CHAT, b'{"model": "fake-qwen", "messages": [', 400, "invalid_json"),
    ("array-body", "POST", CHAT, [], 400, None),
    ("string-body", "POST", CHAT, "hello", 400, None),
    ("null-body", "POST", CHAT, None, 400, None),
    ("number-body", "POST", CHAT, 42, 400, None),
    ("bad-utf8", "POST", CHAT, b'{"model": "\xff\xfe"}', 400, "invalid_json"),
    ("trailing-garbage", "POST", CHAT, json.dumps(OA).encode() + b" }", 400, "invalid_json"),
    ("missing-messages", "POST", CHAT, wo(OA, "messages"), 400, None),
    ("missing-model", "POST", CHAT, wo(OA, "model"), 400, None),
    ("model-int", "POST", CHAT, w(OA, model=5), 400, None),
    ("messages-string", "POST", CHAT, w(OA, messages="hi"), 400, None),
    ("messages-empty", "POST", CHAT, w(OA, messages=[]), 400, None),
    ("message-int", "POST", CHAT, msg(42), 400, None),
    ("message-no-role", "POST", CHAT, msg({"content": "hi"}), 400, None),
    ("user-no-content", "POST", CHAT, msg({"role": "user"}), 400, None),
    ("role-unknown", "POST", CHAT, msg({"role": "wizard", "content": "hi"}), 400, "unsupported_role"),
    ("role-int", "POST", CHAT, msg({"role": 3, "content": "hi"}), 400, None),
    ("content-int", "POST", CHAT, msg({"role": "user", "content": 3}), 400, None),
    ("content-object", "POST", CHAT, msg({"role": "user", "content": {"text": "hi"}}), 400, None),
    ("content-part-int", "POST", CHAT, msg({"role": "user", "content": [3]}), 400, None),
    ("content-part-image", "POST", CHAT, msg({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}), 400, None),
    ("content-part-no-text", "POST", CHAT, msg({"role": "user", "content": [{"type": "text"}]}), 400, None),
    ("no-user-message", "POST", CHAT, msg({"role": "system", "content": "be nice"}), 400, None),
    ("system-not-first", "POST", CHAT, msg(U, {"role": "system", "content": "late"}), 400, None),
    ("tool-calls-not-list", "POST", CHAT, msg(U, {"role": "assistant", "tool_calls": {"a": 1}}), 400, None),
    ("tool-call-no-name", "POST", CHAT, msg(U, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}), 400, None),
    ("tool-call-bad-args", "POST", CHAT, msg(U, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{nope"}}]}), 400, None),
    ("reasoning-int", "POST", CHAT, msg(U, {"role": "assistant", "content": "x", "reasoning_content": 5}), 400, None),
    ("tool-call-id-int", "POST", CHAT, msg(U, {"role": "tool", "content": "x", "tool_call_id": 5}), 400, None),
    ("max-tokens-zero", "POST", CHAT, w(OA, max_tokens=0), 400, None),
    ("max-tokens-negative", "POST", CHAT, w(OA, max_tokens=-5), 400, None),
    ("max-tokens-string", "POST", CHAT, w(OA, max_tokens="10"), 400, None),
    ("max-tokens-float", "POST", CHAT, w(OA, max_tokens=1.5), 400, None),
    ("max-tokens-over-context", "POST", CHAT, w(OA, max_tokens=10**6), 400, "context_length_exceeded"),
    ("max-completion-tokens-zero", "POST", CHAT, w(OA, max_completion_tokens=0), 400, None),
    ("temperature-negative", "POST", CHAT, w(OA, temperature=-1), 400, None),
    ("temperature-high", "POST", CHAT, w(OA, temperature=3), 400, None),
    ("temperature-string", "POST", CHAT, w(OA, temperature="hot"), 400, None),
    ("temperature-bool", "POST", CHAT, w(OA, temperature=True), 400, None),
    ("temperature-huge", "POST", CHAT, b'{"model": "fake-qwen", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}', 400, None),
    ("top-p-high", "POST", CHAT, w(OA, top_p=1.5), 400, None),
    ("top-p-negative", "POST", CHAT, w(OA, top_p=-0.1), 400, None),
    ("top-k-negative", "POST", CHAT, w(OA, top_k=-5), 400, None),
    ("min-p-high", "POST", CHAT, w(OA, min_p=2), 400, None),
    ("presence-high", "POST", CHAT, w(OA, presence_penalty=3), 400, None),
    ("frequency-low", "POST", CHAT, w(OA, frequency_penalty=-2.5), 400, None),
    ("seed-string", "POST", CHAT, w(OA, seed="x"), 400, None),
    ("seed-huge", "POST", CHAT, w(OA, seed=2**70), 400, None),
    ("n-two", "POST", CHAT, w(OA, n=2), 400, "n_not_supported"),
    ("n-zero", "POST", CHAT, w(OA, n=0), 400, "n_not_supported"),
    ("stop-five", "POST", CHAT, w(OA, stop=["a", "b", "c", "d", "e"]), 400, None),
    ("stop-empty-string", "POST", CHAT, w(OA, stop=[""]), 400, None),
    ("stop-int", "POST", CHAT, w(OA, stop=42), 400, None),
    ("stream-string", "POST", CHAT, w(OA, stream="yes"), 400, None),
    ("stream-options-string", "POST", CHAT, w(OA, stream=True, stream_options="all"), 400, None),
    ("tools-not-list", "POST", CHAT, w(OA, tools="f"), 400, None),
    ("tool-type-retrieval", "POST", CHAT, w(OA, tools=[{"type": "retrieval"}]), 400, "tool_type_not_supported"),
    ("tool-name-spaces", "POST", CHAT, w(OA, tools=[{"type": "function", "function": {"name": "bad name"}}]), 400, None),
    ("tool-no-function", "POST", CHAT, w(OA, tools=[{"type": "function"}]), 400, "tool_type_not_supported"),
    ("tool-choice-required", "POST", CHAT, w(OA, tools=[TOOL], tool_choice="required"), 400, "tool_choice_not_supported"),
    ("tool-choice-named", "POST", CHAT, w(OA, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}), 400, "tool_choice_not_supported"),
    ("legacy-functions", "POST", CHAT, w(OA, functions=[{"name": "f"}]), 400, "tools_not_supported"),
    ("response-format-json", "POST", CHAT, w(OA, response_format={"type": "json_object"}), 400, "response_format_not_supported"),
    ("logprobs", "POST", CHAT, w(OA, logprobs=True), 400, "logprobs_not_supported"),
    ("logit-bias", "POST", CHAT, w(OA, logit_bias={"11": 5}), 400, "logit_bias_not_supported"),
    ("enable-thinking-string", "POST", CHAT, w(OA, enable_thinking="yes"), 400, None),
    ("thinking-conflict", "POST", CHAT, w(OA, enable_thinking=True, chat_template_kwargs={"enable_thinking": False}), 400, "conflicting_template_option"),
    ("template-kwargs-reserved", "POST", CHAT, w(OA, chat_template_kwargs={"messages": []}), 400, None),
    ("template-kwargs-list", "POST", CHAT, w(OA, chat_template_kwargs=[1]), 400, None),
    ("template-kwargs-thinking-int", "POST", CHAT, w(OA, chat_template_kwargs={"enable_thinking": 1}), 400, None),
    ("deep-nesting-tool-schema", "POST", CHAT, nested_tool(990), 400, None),
    ("deeper-nesting-tool-schema", "POST", CHAT, nested_tool(5000), 400, None),
    ("deep-nesting-body", "POST", CHAT, b'{"model": ' + b"[" * 50000 + b"]" * 50000 + b"}", 400, None),
    ("unknown-model", "POST", CHAT, w(OA, model="gpt-9"), 404, "model_not_found"),
    ("prompt-over-context", "POST", CHAT, msg({"role": "user", "content": "word " * 700}), 400, "context_length_exceeded"),
    ("get-on-post-route", "GET", CHAT, None, 405, None),
    ("delete-models", "DELETE", "/v1/models", None, 405, None),
    ("unknown-route", "POST", "/v1/completions", OA, 404, None),
    ("unknown-model-get", "GET", "/v1/models/gpt-9", None, 404, "model_not_found"),
    # Anthropic
    ("a-missing-max-tokens", "POST", MSGS, wo(AN, "max_tokens"), 400, None),
    ("a-max-tokens-zero", "POST", MSGS, w(AN, max_tokens=0), 400, None),
    ("a-max-tokens-over-context", "POST", MSGS, w(AN, max_tokens=100000), 400, None),
    ("a-role-system", "POST", MSGS, amsg({"role": "system", "content": "x"}), 400, None),
    ("a-role-tool", "POST", MSGS, amsg({"role": "tool", "content": "x"}), 400, None),
    ("a-messages-empty", "POST", MSGS, w(AN, messages=[]), 400, None),
    ("a-content-int", "POST", MSGS, amsg({"role": "user", "content": 7}), 400, None),
    ("a-content-null", "POST", MSGS, amsg({"role": "user", "content": None}), 400, None),
    ("a-block-image", "POST", MSGS, amsg({"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}), 400, None),
    ("a-block-unknown", "POST", MSGS, amsg({"role": "user", "content": [{"type": "bogus"}]}), 400, None),
    ("a-block-no-type", "POST", MSGS, amsg({"role": "user", "content": [{"text": "x"}]}), 400, None),
    ("a-text-no-text", "POST", MSGS, amsg({"role": "user", "content": [{"type": "text"}]}), 400, None),
    ("a-tool-result-no-id", "POST", MSGS, amsg({"role": "user", "content": [{"type": "tool_result", "content": "x"}]}), 400, None),
    ("a-tool-use-in-user", "POST", MSGS, amsg({"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}), 400, None),
    ("a-tool-use-bad-name", "POST", MSGS, amsg(U, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "a b", "input": {}}]}), 400, None),
    ("a-thinking-type", "POST", MSGS, w(AN, thinking={"type": "maybe"}), 400, None),
    ("a-temperature-high", "POST", MSGS, w(AN, temperature=1.5), 400, None),
    ("a-top-p-high", "POST", MSGS, w(AN, top_p=2), 400, None),
    ("a-tool-choice-any", "POST", MSGS, w(AN, tools=[{"name": "f", "input_schema": {}}], tool_choice={"type": "any"}), 400, "tool_choice_not_supported"),
    ("a-server-tool", "POST", MSGS, w(AN, tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400, "tool_type_not_supported"),
    ("a-system-image", "POST", MSGS, w(AN, system=[{"type": "image"}]), 400, None),
    ("a-system-int", "POST", MSGS, w(AN, system=5), 400, None),
    ("a-stop-sequences-string", "POST", MSGS, w(AN, stop_sequences="STOP"), 400, None),
    ("a-malformed", "POST", MSGS, b"{'model': 'm'}", 400, None),
    ("a-array-body", "POST", MSGS, [AN], 400, None),
    ("a-prompt-over-context", "POST", MSGS, amsg({"role": "user", "content": "word " * 700}), 400, "context_length_exceeded"),
    ("count-empty-messages", "POST", COUNT, {"model": "m", "messages": []}, 400, None),
    ("count-not-object", "POST", COUNT, b"[]", 400, None),
    ("count-missing-messages", "POST", COUNT, {"model": "m"}, 400, None),
    ("count-bad-role", "POST", COUNT, {"model": "m", "messages": [{"role": "bot", "content": "x"}]}, 400, "unsupported_role"),
]


def send(url: str, method: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else None if method != "POST" else json.dumps(body).encode()
    return httpx.request(method, url + path, content=content, headers={"content-type": "application/json"}, timeout=30, **kw)


def check_error(r: httpx.Response, path: str, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    else:
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        if code is not None:
            assert err["code"] == code, err
    return body


def test_enough_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize("name,method,path,body,status,code", CASES, ids=[c[0] for c in CASES])
def test_bad_request(fake, name, method, path, body, status, code):
    check_error(send(fake.url, method, path, body), path, status, code)


def test_context_error_names_both_counts(fake):
    r = send(fake.url, "POST", CHAT, w(OA, max_tokens=100000))
    message = r.json()["error"]["message"]
    prompt = len(fake.llm.tokenizer.encode(fake.llm.chat.render(OA["messages"])))
    assert str(prompt) in message and "100000" in message and str(fake.llm.max_context) in message
    r = send(fake.url, "POST", MSGS, amsg({"role": "user", "content": "word " * 700}))
    assert "512" in r.json()["error"]["message"]


def test_error_param_names_the_field(fake):
    r = send(fake.url, "POST", CHAT, msg({"role": "user", "content": 3}))
    assert r.json()["error"]["param"] == "messages[0].content"
    r = send(fake.url, "POST", CHAT, w(OA, temperature=5))
    assert r.json()["error"]["param"] == "temperature"


# --- fuzzing ---------------------------------------------------------------------------------------

WRONG_TYPES = {
    CHAT: {
        "model": [1, [], {}],
        "messages": ["x", 1, {}, [1], [[]]],
        "max_tokens": ["1", 1.5, True, []],
        "temperature": ["hot", True, [], {}],
        "top_p": ["x", False],
        "top_k": [1.5, "5"],
        "seed": ["s", 1.5],
        "stop": [1, [1], {}],
        "stream": ["yes", 1, []],
        "n": ["1", 1.5],
        "tools": ["t", 1, [1]],
        "tool_choice": [1, [], True],
        "enable_thinking": ["yes", 1],
        "chat_template_kwargs": [[], "x", 1],
        "stream_options": ["x", 1, []],
    },
    MSGS: {
        "model": [1, [], {}],
        "max_tokens": ["1", 1.5, []],
        "messages": ["x", 1, {}, [1]],
        "system": [1, {}, [1]],
        "stop_sequences": ["s", [1]],
        "stream": ["y", 1],
        "thinking": ["on", 1, []],
        "tools": ["t", [1]],
        "tool_choice": ["auto", 1],
        "temperature": ["x", []],
    },
}
OUT_OF_RANGE = {
    CHAT: {
        "temperature": [-0.5, 2.5, 1e300],
        "top_p": [1.01, -1],
        "min_p": [-0.1, 1.5],
        "presence_penalty": [2.01, -3],
        "frequency_penalty": [9, -2.01],
        "max_tokens": [0, -1, 10**9],
        "n": [2, 0, 5],
        "top_k": [-2, -100],
        "seed": [2**64, -(2**63) - 1],
    },
    MSGS: {"temperature": [1.5, -1], "top_p": [2], "max_tokens": [0, -3, 10**9], "top_k": [-2]},
}


def fuzz_cases(seed: int = 20260501, n: int = 120) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        path = rng.choice([CHAT, MSGS, COUNT])
        base = OA if path == CHAT else AN
        kind = rng.choice(["truncate", "type", "garbage", "toplevel", "range", "role"])
        if kind == "range" and path == COUNT:
            kind = "type"  # count_tokens samples nothing: ranges do not apply
        schema = WRONG_TYPES[CHAT if path == CHAT else MSGS]
        if kind == "truncate":
            raw = json.dumps(base).encode()
            body = raw[: rng.randrange(0, len(raw))]
        elif kind == "type":
            field = rng.choice(sorted(schema))
            body = json.dumps(w(base, **{field: rng.choice(schema[field])})).encode()
        elif kind == "garbage":
            body = b"#" + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        elif kind == "toplevel":
            body = json.dumps(rng.choice([[], [base], 0, -1.5, "text", None, True])).encode()
        elif kind == "range":
            ranges = OUT_OF_RANGE[path]
            field = rng.choice(sorted(ranges))
            body = json.dumps(w(base, **{field: rng.choice(ranges[field])})).encode()
        else:
            role = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randrange(1, 12)))
            body = json.dumps(w(base, messages=[{"role": role, "content": "hi"}])).encode()
        out.append((path, body))
    return out


def test_fuzzed_bodies_all_4xx_and_server_keeps_serving(fake):
    cases = fuzz_cases()
    assert len(set(cases)) >= 100  # distinct (route, body) pairs
    with httpx.Client(base_url=fake.url, timeout=30) as client:
        for path, body in cases:
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (path, body[:200], r.status_code, r.text)
            check_error(r, path, r.status_code)
        ok = client.post(CHAT, json=OA)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        ok = client.post(MSGS, json=AN)
        assert ok.status_code == 200
    fake.wait_idle()


def test_server_serves_after_bad_input(fake):
    seen = len(fake.log.lines)
    for _, method, path, body, _, _ in CASES[:20]:
        send(fake.url, method, path, body)
    r = fake.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.usage.completion_tokens == 3
    assert httpx.get(fake.url + "/health").json() == {"status": "ok"}
    assert not [x for x in fake.log.lines[seen:] if x["status"] >= 500]


# --- API key ------------------------------------------------------------------------------------

ROUTES = [("GET", "/v1/models", None), ("GET", "/v1/models/" + MODEL, None), ("POST", CHAT, OA), ("POST", MSGS, AN), ("POST", COUNT, AN), ("GET", "/nope", None)]


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": f"Bearer {API_KEY}x"},
        {"authorization": f"Bearer {API_KEY[:-1]}"},
        {"authorization": f"Basic {API_KEY}"},
        {"x-api-key": "wrong"},
        {"x-api-key": ""},
    ],
    ids=["none", "wrong", "longer", "prefix", "basic", "x-wrong", "x-empty"],
)
def test_missing_or_wrong_key_is_401(keyed, method, path, body, headers):
    content = json.dumps(body).encode() if body is not None else None
    r = httpx.request(method, keyed.url + path, content=content, headers=headers)
    body_out = check_error(r, path, 401, None if path.startswith("/v1/messages") else "invalid_api_key")
    if path.startswith("/v1/messages"):
        assert body_out["error"]["type"] == "authentication_error"


def test_right_key_passes_and_health_is_open(keyed):
    assert httpx.get(keyed.url + "/health").status_code == 200
    r = keyed.openai(api_key=API_KEY).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage.completion_tokens == 2
    m = keyed.anthropic(api_key=API_KEY).messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert m.usage.output_tokens == 2
    assert httpx.get(keyed.url + "/v1/models", headers={"x-api-key": API_KEY}).status_code == 200


def test_key_compare_is_constant_time(keyed, monkeypatch):
    import ninfer.server.app as app_module

    calls = []
    real = app_module.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(app_module.hmac, "compare_digest", spy)
    httpx.get(keyed.url + "/v1/models", headers={"authorization": "Bearer nope"})
    assert calls and calls[-1][1] == API_KEY.encode()


# --- body cap -----------------------------------------------------------------------------------


def big_chat(size: int) -> bytes:
    return json.dumps(w(OA, messages=[{"role": "user", "content": "x" * size}])).encode()


def test_oversized_body_is_413(keyed):
    h = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    r = httpx.post(keyed.url + CHAT, content=big_chat(BODY_CAP + 10), headers=h)
    check_error(r, CHAT, 413, "request_too_large")
    r = httpx.post(keyed.url + MSGS, content=json.dumps(w(AN, system="y" * (BODY_CAP + 10))).encode(), headers=h)
    assert check_error(r, MSGS, 413)["error"]["type"] == "request_too_large"


def test_chunked_body_over_cap_is_413(keyed):
    """No Content-Length to go by: the bytes themselves are counted."""
    data = big_chat(3 * BODY_CAP)

    def chunks():
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    r = httpx.post(keyed.url + CHAT, content=chunks(), headers={"authorization": f"Bearer {API_KEY}"})
    assert "content-length" not in r.request.headers
    check_error(r, CHAT, 413, "request_too_large")
    # just under the cap is read and served
    ok = httpx.post(keyed.url + CHAT, content=big_chat(1000), headers={"authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200


def test_body_crossing_the_cap_on_its_last_chunk_is_413():
    """The chunk that crosses the cap is the body's last: still a 413, not a 500 (a second
    request.stream() after the last chunk raised "Stream consumed")."""
    import asyncio

    from starlette.requests import Request

    from ninfer.server.lifecycle import read_body
    from ninfer.server.errors import ApiError

    for sizes in ([40, 70], [120], [50, 50, 30]):
        messages = [{"type": "http.request", "body": b"x" * n, "more_body": i < len(sizes) - 1} for i, n in enumerate(sizes)]

        async def receive(messages=messages):
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        request = Request({"type": "http", "method": "POST", "headers": []}, receive)
        with pytest.raises(ApiError) as err:
            asyncio.run(read_body(request, 100))
        assert err.value.status == 413
