"""Qwen <tool_call> parsing: strict blocks, schema typing without eval, streaming."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from ninfer.frontend.chat import render_chat
from ninfer.frontend.toolcalls import ToolCall, ToolCallStream, parse_tool_calls, typed_value

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "temp": {"type": "number"},
                    "metric": {"type": "boolean"},
                    "opts": {"type": "object"},
                    "hours": {"type": "array", "items": {"type": "integer"}},
                    "note": {"type": ["string", "null"]},
                    "maybe_int": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "level": {"enum": [1, 2, 3]},
                    "nothing": {"type": "null"},
                },
            },
        },
    },
    {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
    {"name": "anthropic_style", "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
]


def block(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(text, tools=TOOLS):
    return parse_tool_calls(text, tools, make_id=ids())


def test_plain_text_has_no_calls():
    assert parse("Just an answer.") == ("Just an answer.", [])
    assert parse("") == ("", [])


def test_one_call_with_content_before():
    text = "Let me check.\n\n" + block("get_weather", city="Paris", days=3)
    assert parse(text) == ("Let me check.", [ToolCall("call_0", "get_weather", '{"city": "Paris", "days": 3}')])


def test_several_calls():
    text = block("get_weather", city="A") + "\n" + block("search", q="B") + "\n\n" + block("anthropic_style", n="7") + "\n"
    content, calls = parse(text)
    assert content == ""
    assert [(c.name, c.input) for c in calls] == [("get_weather", {"city": "A"}), ("search", {"q": "B"}), ("anthropic_style", {"n": 7})]
    assert [c.id for c in calls] == ["call_0", "call_1", "call_2"]


def test_schema_types():
    text = block(
        "get_weather",
        city="123",
        days="  42 ",
        temp="-3.5e1",
        metric="True",
        opts='{"a": [1, {"b": null}], "u": "ü"}',
        hours="[1, 2, 3]",
        note="null",
        maybe_int="17",
        level="2",
        nothing="None",
    )
    (call,) = parse(text)[1]
    assert call.input == {
        "city": "123",
        "days": 42,
        "temp": -35.0,
        "metric": True,
        "opts": {"a": [1, {"b": None}], "u": "ü"},
        "hours": [1, 2, 3],
        "note": None,
        "maybe_int": 17,
        "level": 2,
        "nothing": None,
    }
    assert "ü" in call.arguments  # ensure_ascii=False, like the template's tojson


@pytest.mark.parametrize(
    "schema,text,expected",
    [
        ({"type": "integer"}, "4.0", 4),
        ({"type": "integer"}, "4.5", "4.5"),
        ({"type": "integer"}, "four", "four"),
        ({"type": "integer"}, "٣", "٣"),  # a non-ASCII digit is text, not 3
        ({"type": "integer"}, "9" * 5000, "9" * 5000),  # past Python's int-from-str limit: stays text
        ({"type": "number"}, "NaN", "NaN"),
        ({"type": "number"}, "Infinity", "Infinity"),
        ({"type": "number"}, "1e999", "1e999"),
        ({"type": "number"}, "true", "true"),
        ({"type": "boolean"}, "FALSE", False),
        ({"type": "boolean"}, "yes", "yes"),
        ({"type": "object"}, "{'a': True, 'b': (1, 2)}", {"a": True, "b": [1, 2]}),  # Python literal, no eval
        ({"type": "object"}, "[1]", "[1]"),
        ({"type": "object"}, "{1: 2}", "{1: 2}"),
        ({"type": "object"}, "{'s': {1, 2}}", "{'s': {1, 2}}"),
        ({"type": "object"}, "__import__('os').system('echo pwned')", "__import__('os').system('echo pwned')"),
        ({"type": "array"}, "[" * 10000 + "]" * 10000, "[" * 10000 + "]" * 10000),
        ({"type": "array"}, "(1, 'a')", [1, "a"]),
        ({"type": "null"}, "nil", "nil"),
        ({"type": "string"}, " 42 ", " 42 "),
        ({}, "42", "42"),
        (None, "[1]", "[1]"),
        ({"type": ["null", "integer", "string"]}, "null", None),
        ({"oneOf": [{"type": "boolean"}, {"type": "array"}]}, "[true]", [True]),
        ({"const": 3.5}, "3.5", 3.5),
    ],
)
def test_typed_value(schema, text, expected):
    assert typed_value(text, schema) == expected


def test_unknown_params_and_unknown_tools_stay_strings():
    content, calls = parse(block("get_weather", extra="5") + block("not_a_tool", x="[1]", y="2"))
    assert [(c.name, c.input) for c in calls] == [("get_weather", {"extra": "5"}), ("not_a_tool", {"x": "[1]", "y": "2"})]
    content, calls = parse(block("search", q="5"), tools=None)
    assert calls[0].input == {"q": "5"}


def test_multiline_and_xmlish_values():
    value = "line 1\n\n  indented\n<b>bold</b> </parameter> inside\nlast"
    (call,) = parse(block("search", q=value))[1]
    assert call.input == {"q": value}
    (call,) = parse("<tool_call>\n<function=search>\n<parameter=q>\n\n\nblank lines\n\n\n</parameter>\n</function>\n</tool_call>")[1]
    assert call.input == {"q": "\n\nblank lines\n\n"}


def test_unicode():
    content, calls = parse("好的 🤖\n\n" + block("search", q="東京 の 天気 🌦️"))
    assert content == "好的 🤖"
    assert calls[0].input == {"q": "東京 の 天気 🌦️"}


def test_no_parameters_and_compact_whitespace():
    assert parse("<tool_call><function=search></function></tool_call>")[1][0].input == {}
    compact = "<tool_call><function=search><parameter=q>x</parameter></function></tool_call>"
    assert parse(compact)[1][0].input == {"q": "x"}


MALFORMED = [
    "<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n</function>",  # no </tool_call>
    "<tool_call>\n<function=search>\n<parameter=q>\nx\n</function>\n</tool_call>",  # parameter not closed
    "<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n</tool_call>",  # no </function>
    "<tool_call>\nsearch(q='x')\n</tool_call>",
    "<tool_call>\n<function=bad name>\n</function>\n</tool_call>",
    "<tool_call>\n<function=" + "a" * 65 + ">\n</function>\n</tool_call>",
    "<tool_call>\n<function=>\n</function>\n</tool_call>",
    "<tool_call>\n<function=na.me>\n</function>\n</tool_call>",
    "<tool_call>\n<function=search>\nstray text\n</function>\n</tool_call>",
    "<tool_call>\n<function=search>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=search>\n<parameter=q>\n1\n</parameter>\n<parameter=q>\n2\n</parameter>\n</function>\n</tool_call>",
    block("search", q="x") + "\nAnd some text after the call.",
    block("search", q="x") + "\n<tool_call>\n<function=search>\n",  # second block cut off
    block("search", q="x") + "\n<tool_call>\n<function=ok>\n</function>\n</tool_call> trailing",
    "<tool_call><tool_call><function=search></function></tool_call>",
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_falls_back_to_plain_content(text):
    full = "Intro text.\n\n" + text
    assert parse(full) == (full, [])


def test_round_trip_with_the_template():
    """Calls rendered by the chat template into history parse back to the same calls."""
    args = {"city": "Zürich", "days": 2, "temp": 1.5, "metric": False, "opts": {"k": [1, None]}, "hours": [], "note": None}
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": args}},
                {"type": "function", "function": {"name": "search", "arguments": {"q": "multi\nline"}}},
            ],
        },
    ]
    rendered = render_chat(msgs, tools=TOOLS, add_generation_prompt=False)
    generated = rendered.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")
    generated = generated.split("</think>\n\n", 1)[-1]
    content, calls = parse(generated)
    assert content == "Checking."
    assert [(c.name, c.input) for c in calls] == [("get_weather", args), ("search", {"q": "multi\nline"})]


# --- streaming ------------------------------------------------------------------------------------


def _stream(text, cuts, **kw):
    s = ToolCallStream(TOOLS, make_id=ids(), **kw)
    content, calls, prev = [], [], 0
    for cut in [*cuts, len(text)]:
        c, new = s.push(text[prev:cut])
        content.append(c)
        calls += new
        prev = cut
    c, new = s.finish()
    return "".join(content) + c, calls + new


STREAM_TEXTS = [
    "No calls here, just text with < and <tool and spaces   ",
    "Sure.\n\n" + block("get_weather", city="Paris", days=2),
    block("search", q="a") + "\n" + block("search", q="b\n</parameter>\nc") + "\n",
    "Intro  \n\n" + MALFORMED[0],
    "Intro\n\n" + MALFORMED[3] + "\n" + block("search", q="x"),
    "text <tool_cal not a tag",
    "  " + block("anthropic_style", n="5") + "  \n",
]


@pytest.mark.parametrize("text", STREAM_TEXTS)
@pytest.mark.parametrize("emit_early", [True, False])
def test_stream_equals_whole_for_every_cut(text, emit_early):
    whole = parse(text)
    for cut in range(len(text) + 1):
        assert _stream(text, [cut], emit_early=emit_early) == whole, cut
    assert _stream(text, list(range(1, len(text))), emit_early=emit_early) == whole


def test_stream_content_flows_before_the_call_and_calls_come_when_complete():
    s = ToolCallStream(TOOLS, make_id=ids())
    assert s.push("Let me ") == ("Let me", [])
    assert s.push("check.\n\n<tool_") == (" check.", [])
    assert s.push("call>\n<function=search>\n<parameter=q>\nx\n") == ("", [])
    assert s.calls_started
    content, calls = s.push("</parameter>\n</function>\n</tool_call>")
    assert content == "" and [c.input for c in calls] == [{"q": "x"}]
    assert s.finish() == ("", [])


def test_stream_early_calls_stand_when_a_later_block_breaks():
    text = block("search", q="1") + "\n<tool_call>\nbroken\n</tool_call>"
    content, calls = _stream(text, [len(block("search", q="1")) + 1], emit_early=True)
    assert [c.input for c in calls] == [{"q": "1"}]
    assert content == "<tool_call>\nbroken\n</tool_call>"
    # the strict mode and the whole-text parser give everything back as content
    assert _stream(text, [10], emit_early=False) == (text, []) == parse(text)


def test_stream_random_cuts():
    rng = random.Random(5)
    pieces = ["hi ", "\n", block("search", q="v"), block("get_weather", days="3"), "<tool_call>", "</tool_call>", "x", " "]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        assert _stream(text, cuts, emit_early=False) == parse(text), (text, cuts)
        early = _stream(text, cuts, emit_early=True)
        if parse(text)[1] or "</tool_call>" not in text:
            assert early == parse(text), (text, cuts)


def test_arguments_are_json_strings():
    (call,) = parse(block("get_weather", opts="{'x': 1}"))[1]
    assert json.loads(call.arguments) == {"opts": {"x": 1}}
    assert call.id == "call_0"


def test_stream_is_linear_in_a_large_argument():
    """An agent writing a 400 KB file through a tool call: per-push work must not grow with the block."""
    import time

    value = ("line of file content </parameter> not the end\n" * 9000)[:400_000]
    text = "Writing.\n\n" + block("search", q=value)
    t = time.perf_counter()
    for early in (True, False):
        content, calls = _stream(text, list(range(3, len(text), 3)), emit_early=early)
        assert content == "Writing." and calls[0].input == {"q": value}
    assert time.perf_counter() - t < 3.0
