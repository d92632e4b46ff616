"""Stop strings on a stream of text deltas.

The engine runs one `StopMatcher` per channel (stop strings apply to the content channel, or to
both with the OpenAI API). Text is released only when no stop string can still start inside it:
a suffix that is a prefix of some stop string is held back until the next delta decides. The
output ends exactly before the first (leftmost) match, and the match itself is never shown.
"""

from __future__ import annotations

from collections.abc import Iterable

from ninfer.errors import UserError


def held_suffix(text: str, patterns: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `patterns`.

    That much of a stream must wait: the next delta may complete a pattern that started there.
    """
    best = 0
    for p in patterns:
        for k in range(min(len(p) - 1, len(text)), best, -1):
            if text.endswith(p[:k]):
                best = k
                break
    return best


class StopMatcher:
    """`push(delta) -> (safe_text, matched)`; `flush()` releases what was held at the end."""

    def __init__(self, stops: Iterable[str] = ()) -> None:
        stops = list(stops)
        for s in stops:
            if not isinstance(s, str) or not s:
                raise UserError("Each stop string must be a non-empty string.", param="stop")
        self.stops = tuple(dict.fromkeys(stops))
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        if self.matched is not None:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        first, which = -1, None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (first < 0 or i < first):
                first, which = i, s
        if which is not None:
            self._held = ""
            self.matched = which
            return buf[:first], True
        keep = held_suffix(buf, self.stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """End of the stream without a match: the held-back text was not a stop after all."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held
