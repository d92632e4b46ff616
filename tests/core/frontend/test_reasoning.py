"""Reasoning split at </think>: whole-text rules, and the stream equals the whole however it is cut."""

from __future__ import annotations

import random

import pytest

from ninfer.frontend.chat import render_chat
from ninfer.frontend.reasoning import ReasoningSplitter, split_reasoning

CASES = [
    # (generated text, reasoning, content)
    ("Let me think.\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4."),
    ("\n\nleading newlines\n\n\n</think>\n\n\nanswer\n", "leading newlines", "answer\n"),
    ("</think>\n\nno reasoning", "", "no reasoning"),
    ("</think>", "", ""),
    ("still thinking when the budget ran out\n", "still thinking when the budget ran out", ""),
    ("<think>\nself-opened\n</think>\n\nok", "self-opened", "ok"),
    ("r</think>c</think>d", "r", "c</think>d"),
    ("a\n\nb\n</think>x\n\ny", "a\n\nb", "x\n\ny"),
    ("  spaces stay  \n</think>\n  content spaces stay", "  spaces stay  ", "  content spaces stay"),
    ("partial tag at end </thi", "partial tag at end </thi", ""),
    ("<thi", "<thi", ""),
    ("\n<think>\n<think>\ninner\n</think>\n\nend", "<think>\ninner", "end"),
    ("推理 🤔\n</think>\n\n答案 ✅", "推理 🤔", "答案 ✅"),
    ("</ think> is not the tag\n</think>\n\nx", "</ think> is not the tag", "x"),
    ("", "", ""),
    ("\n\n\n", "", ""),
]


@pytest.mark.parametrize("text,reasoning,content", CASES)
def test_whole_split(text, reasoning, content):
    assert split_reasoning(text) == (reasoning, content)


@pytest.mark.parametrize("text", [c[0] for c in CASES])
def test_thinking_off_is_all_content(text):
    assert split_reasoning(text, thinking=False) == ("", text)
    s = ReasoningSplitter(thinking=False)
    out = [s.push(text[i : i + 3]) for i in range(0, len(text), 3)] + [s.finish()]
    assert "".join(r for r, _ in out) == ""
    assert "".join(c for _, c in out) == text


def _stream(text, cuts):
    s = ReasoningSplitter()
    out, prev = [], 0
    for cut in [*cuts, len(text)]:
        out.append(s.push(text[prev:cut]))
        prev = cut
    out.append(s.finish())
    return "".join(r for r, _ in out), "".join(c for _, c in out)


@pytest.mark.parametrize("text", [c[0] for c in CASES])
def test_stream_equals_whole_for_every_single_cut_and_char_by_char(text):
    whole = split_reasoning(text)
    for cut in range(len(text) + 1):
        assert _stream(text, [cut]) == whole, cut
    assert _stream(text, list(range(1, len(text)))) == whole


def test_stream_equals_whole_on_random_text():
    rng = random.Random(3)
    atoms = ["a", "\n", "\n\n", "<think>", "</think>", "</th", "ink>", "<", "/", " ", "思"]
    for _ in range(2000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 5))))
        assert _stream(text, cuts) == split_reasoning(text), (text, cuts)


def test_stream_holds_back_only_what_can_change():
    s = ReasoningSplitter()
    assert s.push("Thinking about it") == ("Thinking about it", "")
    assert s.push(" more\n") == (" more", "")  # the newline may precede </think>
    assert s.push("</th") == ("", "")
    assert s.in_reasoning
    assert s.push("ink>\n") == ("", "")
    assert not s.in_reasoning
    assert s.push("\nAnswer") == ("", "Answer")
    assert s.push("\n\nmore") == ("", "\n\nmore")
    assert s.finish() == ("", "")


def test_round_trip_through_the_template():
    """What we split out renders back to what the model generated after the prompt."""
    generated = "I add the numbers.\n</think>\n\n2 + 2 = 4."
    reasoning, content = split_reasoning(generated)
    msgs = [{"role": "user", "content": "2+2?"}]
    prompt = render_chat(msgs)
    history = render_chat(msgs + [{"role": "assistant", "content": content, "reasoning_content": reasoning}], add_generation_prompt=False)
    assert history == prompt + generated + "<|im_end|>\n"
