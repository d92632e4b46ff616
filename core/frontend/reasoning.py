"""Splitting generated text into `reasoning_content` and `content` at `</think>`.

With thinking on, the generation prompt already ends in `<think>\\n`, so the model starts inside
its reasoning and closes it with `</think>`; the Qwen template writes a past turn back as
`<think>\\n{reasoning}\\n</think>\\n\\n{content}`, and when it has to recover the two from one string
it strips newlines (not other whitespace) on both sides of the tag. We split the same way:

    reasoning = text before the first </think>, newlines stripped at both ends
    content   = text after it, leading newlines stripped

A `<think>` the model writes itself at the very start (a template that does not open the block)
is dropped. No `</think>` at all (the budget ran out mid-thought): everything is reasoning. With
thinking off the prompt closed the block already and everything is content.
"""

from __future__ import annotations

from ninfer.frontend.stops import held_suffix

OPEN = "<think>"
CLOSE = "</think>"


def split_reasoning(text: str, *, thinking: bool = True) -> tuple[str, str]:
    """(reasoning_content, content) of a whole generation."""
    if not thinking:
        return "", text
    t = text.lstrip("\n")
    if t.startswith(OPEN):
        t = t[len(OPEN) :].lstrip("\n")
    end = t.find(CLOSE)
    if end < 0:
        return t.rstrip("\n"), ""
    return t[:end].rstrip("\n"), t[end + len(CLOSE) :].lstrip("\n")


class ReasoningSplitter:
    """The streaming `split_reasoning`: push text deltas, get (reasoning_delta, content_delta).

    Holds back only what the next delta could change: newlines that may turn out to precede
    `</think>`, and a suffix that may be the start of the tag. The concatenated deltas equal
    `split_reasoning` of the concatenated input, however the text is cut.
    """

    _START, _REASONING, _AFTER_CLOSE, _CONTENT = range(4)

    def __init__(self, *, thinking: bool = True) -> None:
        self.thinking = thinking
        self._state = self._START if thinking else self._CONTENT
        self._open_allowed = True
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        """True until `</think>` has been seen (always False with thinking off)."""
        return self._state in (self._START, self._REASONING)

    def push(self, text: str) -> tuple[str, str]:
        if self._state == self._CONTENT:
            return "", text
        buf = self._held + text
        self._held = ""
        reasoning = ""
        if self._state == self._START:
            while True:
                buf = buf.lstrip("\n")
                if not buf:
                    return "", ""
                if self._open_allowed and OPEN.startswith(buf) and len(buf) < len(OPEN):
                    self._held = buf
                    return "", ""
                if self._open_allowed and buf.startswith(OPEN):
                    buf = buf[len(OPEN) :]
                    self._open_allowed = False
                    continue
                break
            self._state = self._REASONING
        if self._state == self._REASONING:
            end = buf.find(CLOSE)
            if end < 0:
                keep = held_suffix(buf, (CLOSE,))
                safe = buf[: len(buf) - keep]
                emit = safe.rstrip("\n")  # newlines right before </think> are not reasoning
                self._held = buf[len(emit) :]
                return emit, ""
            reasoning = buf[:end].rstrip("\n")
            buf = buf[end + len(CLOSE) :]
            self._state = self._AFTER_CLOSE
        # after </think>: drop the newlines that separate it from the answer
        buf = buf.lstrip("\n")
        if buf:
            self._state = self._CONTENT
        return reasoning, buf

    def finish(self) -> tuple[str, str]:
        """End of generation: what was held back (a partial tag, trailing newlines) is settled."""
        held, self._held = self._held, ""
        if self._state in (self._START, self._REASONING):
            return held.rstrip("\n"), ""
        return "", ""
