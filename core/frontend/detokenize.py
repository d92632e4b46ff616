"""Streaming detokenization: ids in, text out, never half a character.

A byte-level BPE token can end inside a UTF-8 sequence (an emoji is often three tokens), so the
text of a prefix of the ids is not a prefix of the text. `StreamDecoder` feeds token bytes through
an incremental UTF-8 decoder: an incomplete sequence at the end is held until its last byte
arrives, a sequence that can never complete becomes U+FFFD exactly where a one-shot
`bytes.decode(errors="replace")` puts it, and `flush()` turns what is left into U+FFFD. So the
concatenated deltas always equal `tokenizer.decode(all_ids)`.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from ninfer.frontend.tokenizer import Tokenizer


class StreamDecoder:
    """Push token ids, get text deltas.

    `skip_special_tokens` (default on, as for chat output) drops control tokens such as
    <|im_start|> or <|vision_pad|>; <think> and <tool_call> tags always come through as text
    because the reasoning and tool-call parsers read them.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self._skip = tokenizer.control_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int] | int) -> str:
        """The text that `ids` complete; bytes of a character still being spelt are kept back."""
        if isinstance(ids, int):
            ids = (ids,)
        tb = self.tokenizer.token_bytes
        data = b"".join(tb(i) for i in ids if i not in self._skip)
        return self._utf8.decode(data, final=False) if data else ""

    def flush(self) -> str:
        """End of the stream: held bytes of an unfinished character become U+FFFD. Resets the decoder."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    @property
    def pending(self) -> bool:
        """True while bytes of an unfinished character are held back."""
        return bool(self._utf8.getstate()[0])
