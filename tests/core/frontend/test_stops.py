"""Stop strings: released text never contains a stop, truncation is exactly at the first match."""

from __future__ import annotations

import random

import pytest

from ninfer.errors import UserError
from ninfer.frontend.stops import StopMatcher, held_suffix


def _reference(text, stops):
    """The whole-text answer: cut before the leftmost occurrence of any stop."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def _stream(text, stops, cuts):
    m = StopMatcher(stops)
    out, matched, prev = [], False, 0
    for cut in [*cuts, len(text)]:
        safe, hit = m.push(text[prev:cut])
        out.append(safe)
        prev = cut
        if hit:
            matched = True
    out.append(m.flush())
    return "".join(out), matched


def test_basic_hold_and_release():
    m = StopMatcher(["STOP"])
    assert m.push("hello ST") == ("hello ", False)
    assert m.push("AR") == ("STAR", False)
    assert m.push("t S") == ("t ", False)
    assert m.push("TOP and more") == ("", True)
    assert m.matched == "STOP"
    assert m.push("after") == ("", True)
    assert m.flush() == ""


def test_flush_releases_a_prefix_that_never_completed():
    m = StopMatcher(["\n\nUser:"])
    assert m.push("answer\n\nUs") == ("answer", False)
    assert m.flush() == "\n\nUs"


def test_leftmost_match_wins_across_stops():
    m = StopMatcher(["world", "lo w"])
    assert m.push("hello world") == ("hel", True)
    assert m.matched == "lo w"


def test_no_stops_passes_through():
    m = StopMatcher([])
    assert m.push("anything") == ("anything", False)
    assert m.flush() == ""


def test_unicode_stops():
    assert _stream("答案是四。结束了", ["结束"], [1, 4, 6]) == ("答案是四。", True)
    assert _stream("emoji 🛑 stop", ["🛑"], [7]) == ("emoji ", True)


@pytest.mark.parametrize("bad", [[""], [None], [3]])
def test_bad_stop_strings(bad):
    with pytest.raises(UserError):
        StopMatcher(bad)


def test_held_suffix():
    assert held_suffix("abcST", ["STOP"]) == 2
    assert held_suffix("abc", ["STOP"]) == 0
    assert held_suffix("xaab", ["aabc", "bz"]) == 3
    assert held_suffix("xSS", ["SSS"]) == 2
    assert held_suffix("STOP", ["STOP"]) == 0  # only proper prefixes: a whole match is found by the caller
    assert held_suffix("", ["a"]) == 0


def test_stream_equals_whole_on_random_text():
    rng = random.Random(11)
    alphabet = "ab\n </>"
    for _ in range(3000):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        assert _stream(text, stops, cuts) == _reference(text, stops), (text, stops, cuts)
