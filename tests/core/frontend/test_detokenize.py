"""Streaming detokenization never shows half a character and adds up to the one-shot decode."""

from __future__ import annotations

import random

import pytest

from ninfer.frontend.detokenize import StreamDecoder
from ninfer.frontend.tokenizer import _BYTE_TO_CHAR

TEXTS = [
    "Hello 你好 🤖🤖 é",
    "家族 👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "长篇中文：人工智能正在改变世界，深度学习模型越来越大。",
    "mixed ascii + ελληνικά + русский + हिन्दी + ไทย",
    "<think>\n推理 🤔\n</think>\n\n答案 ✅",
]


def _stream(decoder, ids, chunk=1):
    deltas = [decoder.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(decoder.flush())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_deltas_add_up_and_are_whole_characters(tokenizer, text, chunk):
    ids = tokenizer.encode(text)
    deltas = _stream(StreamDecoder(tokenizer), ids, chunk)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_an_emoji_split_across_tokens_is_held_until_complete(tokenizer):
    ids = tokenizer.encode(" 🤖")
    assert len(ids) == 3  # b" \xf0\x9f", b"\xa4", b"\x96"
    d = StreamDecoder(tokenizer)
    assert d.push(ids[0]) == " "
    assert d.pending
    assert d.push([ids[1]]) == ""
    assert d.push([ids[2]]) == "🤖"
    assert not d.pending
    assert d.flush() == ""


def test_unfinished_character_is_flushed_as_replacement(tokenizer):
    ids = tokenizer.encode(" 🤖")[:2]
    d = StreamDecoder(tokenizer)
    assert d.push(ids) == " "
    assert d.flush() == "\ufffd"
    assert tokenizer.decode(ids) == " \ufffd"
    assert d.push(tokenizer.encode("ok")) == "ok"  # usable again after flush


def test_random_ids_match_one_shot_decode(tokenizer):
    """Arbitrary ids, invalid UTF-8 included: the stream equals decode(errors=replace)."""
    rng = random.Random(7)
    # single-byte tokens make broken sequences likely
    byte_tokens = [tokenizer.token_to_id(c) for c in _BYTE_TO_CHAR]
    assert all(len(tokenizer.token_bytes(i)) == 1 for i in byte_tokens)
    for _ in range(300):
        ids = [rng.choice(byte_tokens) if rng.random() < 0.6 else rng.randrange(248320) for _ in range(rng.randint(0, 24))]
        d = StreamDecoder(tokenizer, skip_special_tokens=False)
        assert "".join(_stream(d, ids, rng.randint(1, 4))) == tokenizer.decode(ids)


def test_padding_rows_and_specials(tokenizer):
    hello = tokenizer.encode("Hello")
    ids = [248045, *hello, 248200, 248319, 248046]
    assert "".join(_stream(StreamDecoder(tokenizer), ids)) == "Hello"
    assert "".join(_stream(StreamDecoder(tokenizer, skip_special_tokens=False), ids)) == "<|im_start|>Hello<|im_end|>"
    think = tokenizer.encode("<think>x</think>")
    assert "".join(_stream(StreamDecoder(tokenizer), think)) == "<think>x</think>"
    # a padding id between the bytes of one character does not break it
    emoji = tokenizer.encode(" 🤖")
    assert "".join(_stream(StreamDecoder(tokenizer), [emoji[0], 248300, emoji[1], emoji[2]])) == " 🤖"
