"""The native Qwen3.6 renderer against the published template (jinja sandbox), byte for byte."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from pathlib import Path

import pytest

from ninfer.errors import CheckpointError, UserError
from ninfer.frontend.chat import (
    QWEN36_TEMPLATE_SHA256,
    ChatFormat,
    normalize_conversation,
    render_chat,
    template_sha256,
)

# --- tools ----------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate <expr> & return the result; quotes \"ok\" and 'ok'.",
        "parameters": {
            "type": "object",
            "properties": {"expr": {"type": "string"}, "precision": {"type": "integer", "minimum": 0}},
            "required": ["expr"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {"lang": {"type": "string"}}},
                "tags": {"type": "array", "items": {"type": "string"}},
                "limit": {"type": ["integer", "null"]},
                "exact": {"type": "boolean"},
            },
        },
    },
}
TRANSLATE = {
    "type": "function",
    "function": {
        "description": "Traduit un texte — 翻译 🌍 (key order as sent)",
        "name": "traduire",
        "parameters": {"type": "object", "properties": {"texte": {"type": "string"}}},
    },
}
BARE = {"name": "noop", "description": "does nothing", "parameters": {"type": "object", "properties": {}}}
SCALE = {
    "type": "function",
    "function": {"name": "scale", "parameters": {"type": "object", "properties": {"factor": {"type": "number", "default": 1.5}}}},
}


def tc(name, args, *, flat=False, cid="call_1"):
    if flat:
        return {"name": name, "arguments": args}
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text, **kw: {"role": "assistant", "content": text, **kw}  # noqa: E731
S = lambda text: {"role": "system", "content": text}  # noqa: E731
T = lambda text, cid="call_1": {"role": "tool", "tool_call_id": cid, "content": text}  # noqa: E731

# (id, messages, tools, render kwargs)
CASES = [
    ("single_user", [U("Hello!")], None, {}),
    ("system_user", [S("You are a helpful assistant."), U("Hi")], None, {}),
    ("thinking_off", [S("Be brief."), U("Hi")], None, {"enable_thinking": False}),
    ("no_generation_prompt", [U("Hi")], None, {"add_generation_prompt": False}),
    ("multi_turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")], None, {}),
    (
        "reasoning_before_last_user_dropped",
        [U("2+2?"), A("4", reasoning_content="Simple: 2+2=4."), U("and 3+3?")],
        None,
        {},
    ),
    (
        "reasoning_after_last_user_kept",
        [U("2+2?"), A("4", reasoning_content="Simple arithmetic.\n")],
        None,
        {"add_generation_prompt": False},
    ),
    (
        "preserve_thinking",
        [U("2+2?"), A("4", reasoning_content="Simple: 2+2=4."), U("and 3+3?")],
        None,
        {"preserve_thinking": True},
    ),
    (
        "preserve_thinking_false",
        [U("2+2?"), A("4", reasoning_content="r"), U("more")],
        None,
        {"preserve_thinking": False},
    ),
    ("inline_think_in_content", [U("q"), A("<think>\nI think.\n</think>\n\nAnswer."), U("q2")], None, {}),
    ("inline_think_after_last_user", [U("q"), A("<think>\nI think.\n</think>\n\nAnswer.")], None, {"add_generation_prompt": False}),
    ("close_tag_without_open", [U("q"), A("just reasoning\n</think>\n\nthe answer")], None, {"add_generation_prompt": False}),
    (
        "empty_reasoning_string_keeps_content_whole",
        [U("q"), A("a</think>b", reasoning_content="")],
        None,
        {"add_generation_prompt": False},
    ),
    ("developer_first", [{"role": "developer", "content": "Follow the rules."}, U("Hi")], None, {}),
    ("developer_with_tools", [{"role": "developer", "content": "Use tools."}, U("Weather in Paris?")], [WEATHER], {}),
    ("system_with_tools", [S("You are a weather bot."), U("Weather in Paris?")], [WEATHER, CALC], {}),
    ("tools_no_system", [U("What is 2**10?")], [CALC], {}),
    ("tools_empty_system", [S(""), U("Search cats")], [SEARCH], {}),
    ("tools_whitespace_system", [S("  \n "), U("Search cats")], [SEARCH], {}),
    ("empty_system_no_tools", [S(""), U("Hi")], None, {}),
    ("system_part_list", [{"role": "system", "content": [{"type": "text", "text": "Part one. "}, {"text": "Part two."}]}, U("Hi")], None, {}),
    (
        "user_part_list",
        [{"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "text", "text": "two parts"}]}],
        None,
        {},
    ),
    (
        "responses_api_parts",
        [{"role": "user", "content": [{"type": "input_text", "text": "in "}, {"type": "text", "text": "put"}]}, A([{"type": "output_text", "text": "out"}]), U("u")],
        None,
        {},
    ),
    ("user_empty_string", [U(""), A("?"), U("Hi")], None, {}),
    ("user_content_none", [{"role": "user", "content": None}, A("?"), U("Hi")], None, {}),
    ("user_content_missing", [{"role": "user"}, U("Hi")], None, {}),
    (
        "tool_call_dict_args",
        [U("Weather in Paris?"), A(None, tool_calls=[tc("get_weather", {"city": "Paris", "unit": "celsius"})])],
        [WEATHER],
        {"add_generation_prompt": False},
    ),
    (
        "tool_call_str_args",
        [U("Weather in Paris?"), A(None, tool_calls=[tc("get_weather", '{"city": "Paris"}')]), T("22C sunny")],
        [WEATHER],
        {},
    ),
    (
        "tool_call_flat_format",
        [U("Weather?"), A("", tool_calls=[tc("get_weather", {"city": "Oslo"}, flat=True)]), T("-3C")],
        [WEATHER],
        {},
    ),
    (
        "two_tool_calls_one_turn",
        [
            U("Weather in Paris and Rome?"),
            A(None, tool_calls=[tc("get_weather", {"city": "Paris"}), tc("get_weather", {"city": "Rome"}, cid="call_2")]),
            T("20C", "call_1"),
            T("25C", "call_2"),
        ],
        [WEATHER],
        {},
    ),
    (
        "content_then_tool_call",
        [U("Weather?"), A("Let me check that for you.", tool_calls=[tc("get_weather", {"city": "Lima"})]), T("18C")],
        [WEATHER],
        {},
    ),
    (
        "typed_arguments",
        [
            U("Search"),
            A(
                None,
                tool_calls=[
                    tc(
                        "search",
                        {
                            "query": "line one\nline two",
                            "filters": {"lang": "日本語", "nested": {"x": [1, 2.5, None]}},
                            "tags": ["a", "b"],
                            "limit": None,
                            "exact": True,
                            "score": 0.1,
                            "count": 10,
                            "empty": "",
                        },
                    )
                ],
            ),
            T('{"results": []}'),
        ],
        [SEARCH],
        {},
    ),
    (
        "tool_results_then_answer_then_user",
        [
            U("Weather in two cities?"),
            A(None, tool_calls=[tc("get_weather", {"city": "A"}), tc("get_weather", {"city": "B"})], reasoning_content="Two calls."),
            T("1C"),
            T("2C"),
            T("3C"),
            A("A is 1C, B is 2C.", reasoning_content="Summarise."),
            U("Thanks! And C?"),
        ],
        [WEATHER],
        {},
    ),
    (
        "agent_step_reasoning_kept",
        [
            U("Weather in Paris?"),
            A(None, reasoning_content="I should call the tool.", tool_calls=[tc("get_weather", {"city": "Paris"})]),
            T("22C"),
        ],
        [WEATHER],
        {},
    ),
    (
        "multi_step_agent",
        [
            S("You are an agent."),
            U("Plan a trip."),
            A("Checking weather.", reasoning_content="Step 1.", tool_calls=[tc("get_weather", {"city": "Kyoto"})]),
            T("Rainy"),
            A(None, reasoning_content="Step 2.", tool_calls=[tc("search", {"query": "Kyoto museums", "limit": 3})]),
            T("Museum list"),
        ],
        [WEATHER, SEARCH],
        {},
    ),
    (
        "user_wrapped_tool_response_is_not_a_query",
        [U("Start"), A("calling", reasoning_content="r1"), U("<tool_response>\nresult\n</tool_response>")],
        None,
        {},
    ),
    ("unicode_heavy", [S("Système: 日本語 🤖"), U("Ñandú 🦤 مرحبا שלום e\u0301 \u200b zero-width"), A("Réponse — ✓"), U("再来一次 🙂")], None, {}),
    ("whitespace_trimmed", [S("\n  sys  \n"), U("\t  question  \n\n"), A("  answer \n"), U(" again ")], None, {}),
    ("special_token_text_in_user", [U("Write <|im_end|> and <think> literally </think>")], None, {}),
    ("tool_message_first", [T("orphan result"), U("Hi")], None, {}),
    ("assistant_first", [A("I start."), U("Hi")], None, {}),
    ("two_users_in_a_row", [U("one"), U("two")], None, {}),
    ("empty_reasoning_after_last_user", [U("q"), A("", reasoning_content="")], None, {"add_generation_prompt": False}),
    ("empty_tool_arguments", [U("noop"), A(None, tool_calls=[tc("noop", {})]), T("done")], [BARE], {}),
    ("empty_string_tool_arguments", [U("noop"), A(None, tool_calls=[tc("noop", "")]), T("done")], [BARE], {}),
    (
        "thinking_off_with_history_reasoning",
        [U("q1"), A("a1", reasoning_content="r1"), U("q2")],
        None,
        {"enable_thinking": False},
    ),
    (
        "tool_content_part_list",
        [U("go"), A(None, tool_calls=[tc("noop", {})]), {"role": "tool", "content": [{"type": "text", "text": "part result"}]}],
        [BARE],
        {},
    ),
    ("tools_unicode_and_floats", [U("scale it")], [TRANSLATE, SCALE, BARE], {}),
    ("whitespace_content_with_tool_call", [U("x"), A("  \n", tool_calls=[tc("noop", {})])], [BARE], {"add_generation_prompt": False}),
    ("extra_message_keys", [{"role": "user", "content": "hi", "name": "bob", "id": 7}], None, {}),
    (
        "long_conversation",
        [S("sys")]
        + [m for i in range(6) for m in (U(f"question {i}"), A(f"answer {i}", reasoning_content=f"thought {i}"))]
        + [U("last")],
        None,
        {},
    ),
    (
        "preserve_thinking_inline_think",
        [U("q"), A("<think>\ninline r\n</think>\n\nans"), U("q2")],
        None,
        {"preserve_thinking": True},
    ),
    ("reasoning_with_surrounding_whitespace", [U("q"), A("ans", reasoning_content="\n\n  spaced out \n\n")], None, {"add_generation_prompt": False}),
    ("tools_empty_list", [U("hi")], [], {}),
    (
        "nested_xmlish_text",
        [U("<tool_call>not a call</tool_call> <b>bold</b>"), A("<function=x> <parameter=y> text"), U("ok")],
        None,
        {},
    ),
]


GOLDEN = Path(__file__).with_name("golden_qwen36.json")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sandbox(template: str) -> ChatFormat:
    return ChatFormat(template, origin="published (forced sandbox)", prefer_native=False)


def test_enough_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


def test_published_template_identity(published_template):
    assert template_sha256(published_template) == QWEN36_TEMPLATE_SHA256
    assert ChatFormat(published_template).is_native
    assert ChatFormat(published_template + "\n").is_native
    assert not _sandbox(published_template).is_native


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_native_equals_published_template(case, published_template):
    _, messages, tools, kwargs = case
    before = copy.deepcopy(messages)
    native = render_chat(messages, tools=tools, **kwargs)
    sandboxed = _sandbox(published_template).render(messages, tools=tools, **kwargs)
    assert native == sandboxed
    assert messages == before, "rendering must not modify the caller's messages"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_native_matches_recorded_template_output(case):
    """Runs without ../shared too: sha256 of what the published template rendered for each case."""
    name, messages, tools, kwargs = case
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert _digest(render_chat(messages, tools=tools, **kwargs)) == golden[name]


def test_recorded_outputs_come_from_the_published_template(published_template):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    sandbox = _sandbox(published_template)
    assert golden == {name: _digest(sandbox.render(m, tools=t, **kw)) for name, m, t, kw in CASES}


def test_simple_prompts_spelt_out():
    assert render_chat([S("sys"), U("Hi")]) == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert render_chat([U("Hi")], enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat([U("q"), A("a", reasoning_content="r")], add_generation_prompt=False) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
    )


def test_native_equals_transformers_rendering(published_template):
    """Our sandbox environment matches Hugging Face's apply_chat_template environment."""
    ctu = pytest.importorskip("transformers.utils.chat_template_utils")
    for name, messages, tools, kwargs in CASES:
        msgs, tool_list = normalize_conversation(messages, tools)
        kw = {"add_generation_prompt": True, "enable_thinking": True, **kwargs}
        rendered, _ = ctu.render_jinja_template(
            conversations=[msgs], tools=tool_list, chat_template=published_template, **kw
        )
        assert render_chat(messages, tools=tools, **kwargs) == rendered[0], name


def _random_conversation(rng: random.Random):
    words = ["hi", "tool", "日本", "🤖", "<think>", "</think>", "\n", "  ", "x", "<tool_response>", "é", "a\nb", ""]

    def text():
        return "".join(rng.choice(words) for _ in range(rng.randint(0, 5)))

    def content():
        r = rng.random()
        if r < 0.6:
            return text()
        if r < 0.75:
            return None
        return [{"type": "text", "text": text()} for _ in range(rng.randint(0, 3))]

    def args():
        vals = [1, -2.5, True, None, "s", "multi\nline", [1, "a"], {"k": {"z": "ü"}}, ""]
        return {f"p{i}": rng.choice(vals) for i in range(rng.randint(0, 3))}

    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": rng.choice(["system", "developer"]), "content": content()})
    for _ in range(rng.randint(1, 8)):
        role = rng.choice(["user", "user", "assistant", "assistant", "tool"])
        m = {"role": role, "content": content()}
        if role == "assistant":
            if rng.random() < 0.5:
                m["reasoning_content"] = text()
            if rng.random() < 0.4:
                m["tool_calls"] = [
                    tc(rng.choice(["get_weather", "calc", "f-1"]), json.dumps(args()) if rng.random() < 0.5 else args(), flat=rng.random() < 0.3)
                    for _ in range(rng.randint(1, 3))
                ]
        msgs.append(m)
    msgs.append({"role": "user", "content": "final " + text()})
    tools = rng.choice([None, [], [WEATHER], [CALC, SEARCH, TRANSLATE]])
    kwargs = {
        "enable_thinking": rng.random() < 0.7,
        "add_generation_prompt": rng.random() < 0.8,
    }
    if rng.random() < 0.5:
        kwargs["preserve_thinking"] = rng.random() < 0.5
    return msgs, tools, kwargs


def test_random_conversations(published_template):
    rng = random.Random(1234)
    sandbox = _sandbox(published_template)
    for _ in range(300):
        msgs, tools, kwargs = _random_conversation(rng)
        if rng.random() < 0.15:  # a stray system message somewhere: both must refuse alike
            msgs.insert(rng.randint(1, len(msgs)), {"role": "system", "content": "late"})
        try:
            native = render_chat(msgs, tools=tools, **kwargs)
        except UserError as e:
            with pytest.raises(UserError) as e2:
                sandbox.render(msgs, tools=tools, **kwargs)
            assert e2.value.message == e.message
            continue
        assert native == sandbox.render(msgs, tools=tools, **kwargs), (msgs, tools, kwargs)


# --- bad conversations ----------------------------------------------------------------------------

BAD = [
    ("empty", [], None, {}, "conversation is empty"),
    ("not_a_list", {"role": "user", "content": "x"}, None, {}, "must be a list"),
    ("message_not_object", ["hello"], None, {}, "a message must be an object"),
    ("unknown_role", [{"role": "bot", "content": "x"}], None, {}, "'bot'"),
    ("missing_role", [{"content": "x"}], None, {}, "role is missing"),
    ("role_not_string", [{"role": 3, "content": "x"}], None, {}, "role is int"),
    ("content_int", [U(5)], None, {}, "content must be a string"),
    ("content_object", [U({"text": "x"})], None, {}, "content must be a string"),
    ("image_part", [U([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])], None, {}, "not supported yet"),
    ("video_part", [U([{"type": "video", "video": "clip.mp4"}])], None, {}, "not supported yet"),
    ("image_in_system", [{"role": "system", "content": [{"type": "image", "image": "a.png"}]}, U("x")], None, {}, "not supported yet"),
    ("string_part", [U(["just a string"])], None, {}, "content part must be an object"),
    ("text_part_without_text", [U([{"type": "text"}])], None, {}, "only text parts"),
    ("audio_part", [U([{"type": "input_audio", "input_audio": {}}])], None, {}, "not supported yet"),
    ("only_system", [S("sys")], None, {}, "no user message"),
    ("only_tool_response_user", [U("<tool_response>\nx\n</tool_response>")], None, {}, "no user message"),
    ("only_assistant", [A("hi")], None, {}, "no user message"),
    ("system_not_first", [U("hi"), S("late")], None, {}, "only be the first message"),
    ("developer_not_first", [U("hi"), {"role": "developer", "content": "late"}], None, {}, "only be the first message"),
    ("two_systems", [S("a"), S("b"), U("hi")], None, {}, "only be the first message"),
    ("tool_calls_not_list", [U("x"), A(None, tool_calls={"name": "f"})], None, {}, "tool_calls must be a list"),
    ("bad_json_arguments", [U("x"), A(None, tool_calls=[tc("f", "{not json")])], None, {}, "not valid JSON"),
    ("list_arguments", [U("x"), A(None, tool_calls=[tc("f", "[1, 2]")])], None, {}, "must be a JSON object"),
    ("int_arguments", [U("x"), A(None, tool_calls=[tc("f", 5)])], None, {}, "must be a JSON object"),
    ("tool_call_without_name", [U("x"), A(None, tool_calls=[{"function": {"arguments": {}}}])], None, {}, "function name"),
    ("tool_call_not_object", [U("x"), A(None, tool_calls=["f()"])], None, {}, "a tool call must be an object"),
    ("reasoning_not_string", [U("x"), A("y", reasoning_content=["r"])], None, {}, "reasoning_content must be a string"),
    ("tool_call_id_int", [U("x"), {"role": "tool", "content": "r", "tool_call_id": 3}], None, {}, "tool_call_id must be a string"),
    ("tools_not_list", [U("x")], {"type": "function"}, {}, "`tools` must be a list"),
    ("tool_not_object", [U("x")], ["get_weather"], {}, "a tool must be an object"),
    ("tool_without_name", [U("x")], [{"type": "function", "function": {"parameters": {}}}], {}, "non-empty string `name`"),
    ("tool_type_not_function", [U("x")], [{"type": "retrieval", "function": {"name": "r"}}], {}, "only function tools"),
    ("enable_thinking_not_bool", [U("x")], None, {"enable_thinking": "yes"}, "`enable_thinking` must be true or false"),
    ("preserve_thinking_not_bool", [U("x")], None, {"preserve_thinking": 1}, "`preserve_thinking` must be true or false"),
    ("non_json_value", [{"role": "user", "content": "x", "meta": object()}], None, {}, "not a JSON value"),
    ("non_string_key", [{"role": "user", "content": "x", "meta": {1: "a"}}], None, {}, "keys must be strings"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_conversations_raise_the_same_user_error(case, request):
    _, messages, tools, kwargs, expected = case
    with pytest.raises(UserError) as native:
        render_chat(messages, tools=tools, **kwargs)
    assert expected in native.value.message
    published_template = request.getfixturevalue("published_template")  # skips here when absent
    with pytest.raises(UserError) as sandboxed:
        _sandbox(published_template).render(messages, tools=tools, **kwargs)
    assert sandboxed.value.message == native.value.message


def test_errors_name_the_field():
    with pytest.raises(UserError) as e:
        render_chat([U("x"), A(None, tool_calls=[tc("f", "{oops")])])
    assert e.value.param == "messages[1].tool_calls[0].function.arguments"
    with pytest.raises(UserError) as e:
        render_chat([{"role": "wizard", "content": "x"}])
    assert e.value.code == "unsupported_role"


# --- formats chosen from a checkpoint -------------------------------------------------------------


def test_from_checkpoint_picks_native_for_the_published_file(tmp_path, published_template):
    (tmp_path / "chat_template.jinja").write_text(published_template, encoding="utf-8")
    assert ChatFormat.from_checkpoint(tmp_path).is_native
    assert ChatFormat.from_checkpoint(None).is_native
    assert ChatFormat.from_checkpoint(tmp_path / "missing").is_native


def test_from_checkpoint_renders_a_different_template_in_the_sandbox(tmp_path, published_template):
    (tmp_path / "chat_template.jinja").write_text("{# local edit #}" + published_template, encoding="utf-8")
    fmt = ChatFormat.from_checkpoint(tmp_path)
    assert not fmt.is_native
    for _, messages, tools, kwargs in CASES[:10]:
        assert fmt.render(messages, tools=tools, **kwargs) == render_chat(messages, tools=tools, **kwargs)


def test_from_checkpoint_reads_tokenizer_config(tmp_path):
    tpl = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": tpl}), encoding="utf-8")
    assert ChatFormat.from_checkpoint(tmp_path).render([U("hi")]) == "[user:hi]"
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}), encoding="utf-8")
    assert ChatFormat.from_checkpoint(tmp_path).render([U("hi")]) == "D1"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}), encoding="utf-8")
    assert ChatFormat.from_checkpoint(tmp_path).is_native
    (tmp_path / "tokenizer_config.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(CheckpointError):
        ChatFormat.from_checkpoint(tmp_path)


def test_template_that_does_not_parse_is_a_checkpoint_error(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{% if %}", encoding="utf-8")
    with pytest.raises(CheckpointError, match="does not parse"):
        ChatFormat.from_checkpoint(tmp_path)


def test_custom_template_sees_developer_and_kwargs():
    # a template that knows the developer role (it names it) receives it as sent
    tpl = (
        "{% for m in messages %}{{ m.role }}{% if m.role == 'developer' %}!{% endif %};{% endfor %}"
        "{{ reasoning_effort }}|{{ preserve_thinking is defined }}"
    )
    assert render_chat([{"role": "developer", "content": "d"}, U("u")], template=tpl, reasoning_effort="high") == (
        "developer!;user;high|False"
    )
    no_dev = "{% for m in messages %}{{ m.role }};{% endfor %}"
    assert render_chat([{"role": "developer", "content": "d"}, U("u")], template=no_dev) == "system;user;"
    assert render_chat([U("u")], template="{{ preserve_thinking }}", preserve_thinking=True) == "True"


def test_sandbox_environment_matches_huggingface():
    # tojson: no HTML escaping, no key sorting, unicode kept; loop controls; generation tag; namespace
    tpl = (
        "{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) | length > 0 }}|"
        "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}|"
        "{% generation %}gen{% endgeneration %}|"
        "{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}"
    )
    tool = {"z": "<a> & 'b' é", "a": 1}
    out = render_chat([U("x")], tools=[{"name": "t", **tool}], template=tpl)
    assert out == '{"name": "t", "z": "<a> & \'b\' é", "a": 1}|True|012|gen|2'


@pytest.mark.parametrize(
    "tpl",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__subclasses__() }}",
        "{% set x = messages.append(1) %}",
        "{% set ns = namespace() %}{% set ns._hidden = 1 %}",
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_sandbox_blocks_escapes(tpl):
    with pytest.raises(UserError):
        render_chat([U("x")], template=tpl)


def test_custom_raise_exception_and_template_errors():
    with pytest.raises(UserError, match="rejected the conversation: boom"):
        render_chat([U("x")], template="{{ raise_exception('boom') }}")
    with pytest.raises(UserError, match="cannot render"):
        render_chat([U("x")], template="{{ messages[0].content + 1 }}")


def test_native_is_fast():
    import time

    msgs = [S("sys")] + [m for i in range(50) for m in (U(f"q{i}"), A(f"a{i}", reasoning_content="r"))] + [U("end")]
    t = time.perf_counter()
    for _ in range(20):
        render_chat(msgs, tools=[WEATHER, CALC, SEARCH])
    assert (time.perf_counter() - t) / 20 < 0.01
