"""The shortlist proposal head (`--lm-head-draft`, spec 3.4): a subset of the head's rows plus an
id map. The MTP drafts with argmax over the shortlist rows (then maps row -> token id); the target
always verifies with its full head, so the shortlist changes acceptance, never the output.

Rows are chosen from counts of the model's own greedy (teacher-forced argmax) tokens over a
corpus: tokenizer special tokens forced in, then ids by descending count (ties: lower id), the
final list ordered by count. `ninfer convert --shortlist N [--corpus FILE]` (`convert_shortlist`)
writes them to `shortlist.safetensors` next to the weights; without that file, `--lm-head-draft`
ranks ids by their frequency in the tokenized default corpus (no model run), a cheap stand-in.

The default corpus is Python's own standard library sources: every machine has them, and code is
the stratum where a shortlist loses least (spec 3.4: 99.47% coverage at 131072 rows).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog
import torch
from tqdm import tqdm

from ninfer.errors import UserError
from ninfer.linear import DENSE, QLinear, dense_weight

log = structlog.get_logger("ninfer.spec_mtp")

SHORTLIST_FILE = "shortlist.safetensors"
# The published head keeps 131072 of 248320 rows (spec 3.4); other vocabularies keep the same share.
PUBLISHED_ROWS, PUBLISHED_VOCAB = 131072, 248320
# q4 with fp16 scales per 64, as the published `text/draft_head` (Q4G64); bf16 when no plugin has it
HEAD_SCHEME = "q4_g64"
DEFAULT_CORPUS_BYTES = 2_000_000


def default_rows(vocab: int) -> int:
    return max(1, min(vocab, round(vocab * PUBLISHED_ROWS / PUBLISHED_VOCAB)))


def stdlib_files() -> list[Path]:
    """The standard library's .py files (tests and site-packages left out), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def default_corpus(max_bytes: int = DEFAULT_CORPUS_BYTES) -> str:
    """The first `max_bytes` of the standard library sources, file by file in sorted order."""
    parts, size = [], 0
    for f in stdlib_files():
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "".join(parts)[:max_bytes]


def rank_rows(counts: torch.Tensor, n: int, forced: Iterable[int] = ()) -> torch.Tensor:
    """The shortlist: `forced` ids (in range) first, then the rest by descending count (ties: lower
    id) up to n ids; the list itself ordered by count descending, stably. int64 [n]."""
    vocab = counts.numel()
    counts = counts.to(torch.int64).cpu()
    forced_ids = sorted({int(i) for i in forced if 0 <= int(i) < vocab})[:n]
    taken = torch.zeros(vocab, dtype=torch.bool)
    taken[forced_ids] = True
    # stable sort by count descending keeps ascending ids among equal counts
    order = torch.sort(-counts, stable=True).indices
    rest = order[~taken[order]][: n - len(forced_ids)]
    ids = torch.cat((torch.tensor(forced_ids, dtype=torch.int64), rest))
    return ids[torch.sort(-counts[ids], stable=True).indices]


@torch.inference_mode()
def greedy_counts(model: Any, ids: list[int], chunk: int = 1024, seq_len: int = 4096) -> torch.Tensor:
    """How often each id is the model's teacher-forced argmax over `ids`, read as independent
    sequences of `seq_len` tokens (bounded KV), each in chunks. int64 [vocab]."""
    vocab = model.shape.vocab_size
    counts = torch.zeros(vocab, dtype=torch.int64)
    cache = model.allocate_cache(1, max(1, min(seq_len, len(ids))), "bf16")
    spans = [(s, p) for s in range(0, len(ids), seq_len) for p in range(s, min(s + seq_len, len(ids)), chunk)]
    for seq_start, start in tqdm(spans, desc="shortlist", unit="chunk", file=sys.stderr, delay=1.0, leave=False):
        if start == seq_start:
            cache.reset(0)
        end = min(start + chunk, seq_start + seq_len, len(ids))
        part = torch.tensor(ids[start:end], dtype=torch.long, device=model.device)
        hidden = model.forward(part, cache, 0, start - seq_start)
        counts += torch.bincount(model.compute_logits(hidden).argmax(-1).cpu(), minlength=vocab)
    return counts


def special_ids(tokenizer: Any) -> list[int]:
    return sorted(set(getattr(tokenizer, "added_tokens", {}).values()))


def save_shortlist(out_dir: str | os.PathLike[str], ids: torch.Tensor, counts: torch.Tensor) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / SHORTLIST_FILE
    save_file(
        {"token_ids": ids.to(torch.int32).contiguous(), "counts": counts[ids].to(torch.int64).contiguous()},
        str(path),
        metadata={"format": "ninfer-shortlist", "version": "1"},
    )
    return path


def load_shortlist(path: str | os.PathLike[str]) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(path))["token_ids"].to(torch.int64)


def convert_shortlist(
    model: str,
    out_dir: str,
    rows: int,
    corpus: str | None = None,
    *,
    device: str = "auto",
    max_tokens: int = 262144,
) -> Path:
    """`ninfer convert --model PATH --shortlist N [--corpus FILE] --out DIR`: run the model over the
    corpus (default: the standard library sources), count its greedy tokens, write the N-row id
    list to DIR/shortlist.safetensors and return that path."""
    from ninfer.frontend.tokenizer import load_tokenizer
    from ninfer.testing import load_model

    if rows < 1:
        raise UserError(f"--shortlist must be a positive number of rows, got {rows}.", param="shortlist")
    if corpus is not None:
        try:
            text = Path(corpus).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UserError(f"--corpus {corpus}: cannot read it ({exc.strerror}).", param="corpus") from None
        if not text.strip():
            raise UserError(f"--corpus {corpus} is empty: give a text file.", param="corpus")
    else:
        text = default_corpus()
    m = load_model(model, device=device)
    tok = load_tokenizer(model)
    vocab = m.shape.vocab_size
    ids = [t for t in tok.encode(text)[:max_tokens] if t < vocab]
    counts = greedy_counts(m, ids)
    forced = special_ids(tok)
    shortlist = rank_rows(counts, min(rows, vocab), forced)
    path = save_shortlist(out_dir, shortlist, counts)
    covered = int(counts[shortlist].sum())
    log.info("shortlist written", path=str(path), rows=len(shortlist), coverage=covered / max(1, int(counts.sum())))
    return path


# --- the head at run time ------------------------------------------------------------------------


def _head_rows(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """The full head's rows `ids` in float32 [N, H]: from the checkpoint when it is at hand (no
    rounding twice), else from the loaded head (dequantized row by row when packed)."""
    source = getattr(model, "weight_source", None)
    tied = model.lm_head is None
    name = (getattr(model, "checkpoint_prefix", "") + "embed_tokens.weight") if tied else "lm_head.weight"
    if source is not None and source.has(name):
        return source.get(name)[ids.cpu()].float()
    if tied:
        return model.embed_tokens[ids.to(model.embed_tokens.device)].float()
    packed = model.lm_head.packed
    idx = ids.to(model.device)
    if packed is not None and packed.scheme == DENSE:
        return packed.tensors["weight"][idx].float()
    # a quantized head (perhaps repacked by its kernel): read the rows back through the kernel,
    # 256 hidden units at a time (W.T = head(I))
    h = model.shape.hidden_size
    eye = torch.eye(h, dtype=model.dtype, device=model.device)
    return torch.cat([model.lm_head(eye[i : i + 256])[:, idx].float() for i in range(0, h, 256)]).T.contiguous()


class ShortlistHead:
    """Shortlist rows as one QLinear [N, H] (q4_g64 when a quant plugin provides it) + id map."""

    def __init__(self, model: Any, ids: torch.Tensor, schemes: dict[str, Any] | None = None) -> None:
        self.ids = ids.to(device=model.device, dtype=torch.long)
        n, h = len(ids), model.shape.hidden_size
        schemes = schemes or {}
        scheme = HEAD_SCHEME if HEAD_SCHEME in schemes else DENSE
        w = _head_rows(model, ids)
        self.linear = QLinear("mtp.draft_head", n, h, scheme, model.factory.kernel_for(scheme, n, h))
        if scheme == DENSE:
            self.linear.set_weight(dense_weight(w.to(device=model.device, dtype=model.dtype)))
        else:
            self.linear.set_weight(schemes[scheme].quantize(w.to(model.device)).to(model.device))
        self.scheme = scheme

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The shortlist rows' logits [B, N] (row r is token ids[r]), in the model's dtype."""
        return self.linear(hidden)

    @torch.no_grad()
    def propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft ids [B] from hidden [B, H]: the best shortlist row, mapped to its token id."""
        return self.ids[self.logits(hidden).argmax(-1)]


def shortlist_for(model: Any, config: Any) -> torch.Tensor:
    """The row ids `--lm-head-draft` uses: the checkpoint's shortlist.safetensors, else the
    frequency ranking of the tokenized default corpus (a stand-in until `ninfer convert
    --shortlist` has been run; it costs a few seconds of tokenizing at start)."""
    source = getattr(model, "weight_source", None)
    folder = Path(source.path) if source is not None and getattr(source, "path", None) else None
    if folder is not None and (folder / SHORTLIST_FILE).is_file():
        ids = load_shortlist(folder / SHORTLIST_FILE)
        bad = ids[(ids < 0) | (ids >= model.shape.vocab_size)]
        if len(bad):
            raise UserError(
                f"{folder / SHORTLIST_FILE} names token {int(bad[0])}, outside the model's vocabulary: "
                "rebuild it with `ninfer convert --shortlist N`."
            )
        return ids
    from ninfer.frontend.tokenizer import load_tokenizer

    log.warning(
        "no shortlist.safetensors with the weights: ranking the head's rows by corpus frequency; "
        "run `ninfer convert --shortlist N` for the model's own ranking",
        folder=str(folder) if folder else None,
    )
    tok = load_tokenizer(folder)
    vocab = model.shape.vocab_size
    ids = torch.tensor([t for t in tok.encode(default_corpus()) if t < vocab], dtype=torch.int64)
    counts = torch.bincount(ids, minlength=vocab)
    return rank_rows(counts, default_rows(vocab), special_ids(tok))
