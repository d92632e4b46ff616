"""The sampler contract: logits in, token ids out, with no mutable RNG state.

Randomness is counter-based: the uniform draw for a row is a pure function of (seed, absolute
position, purpose), so a request replays exactly, on CPU or GPU, whatever else was batched with it,
and speculative verification can re-derive the draws it needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from enum import IntEnum
from typing import Protocol

import torch

from ninfer.config import SamplingParams
from ninfer.device import Requirements


class Purpose(IntEnum):
    """Why a uniform is drawn; part of the RNG key (spec section 3.1)."""

    PREFILL = 0
    DECODE = 1
    SPEC_ACCEPT = 2
    SPEC_CORRECTION = 3
    SPEC_BONUS = 4
    DRAFT_PROPOSAL = 5


class Sampler(Protocol):
    name: str
    requirements: Requirements

    def probs(self, logits: torch.Tensor, params: Sequence[SamplingParams], history: Sequence[Sequence[int]]) -> torch.Tensor:
        """The processed distribution [B, V] (float32) each row samples from: penalties over the
        row's generated tokens, top-k (<= 20), temperature, min-p, top-p, renormalised.
        Greedy rows are a point mass on the argmax (lowest id on ties)."""

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        history: Sequence[Sequence[int]],
        positions: Sequence[int],
        purpose: Purpose = Purpose.DECODE,
    ) -> torch.Tensor:
        """One token id per row [B] (int64)."""

    # Optional, for captured steps (ninfer.graphs, batched speculative rounds): the same pipeline on
    # tensors with no host sync, `ninfer.kernels.sampling.sample_rows`'s signature and results. A
    # sampler without it gets the reference's.
    # def sample_rows(self, logits, temperature, top_k, top_p, min_p, presence, frequency, seeds,
    #                 positions, purpose, *, counts=None, count_rows=None, extra_ids=None,
    #                 extra_len=None, group=1, pad_row=None, record=False,
    #                 token_out=None) -> tuple[ids, probs, token | None]
    # (`group`: parameters given once per that many consecutive rows; `pad_row`: the counts row of
    # rows whose count row is < 0; `record`: the drawn tokens added to the counts; `token_out`:
    # where the tokens go. A sampler written before these keywords existed gets them done around
    # its call by `rows_sampler`.) logits may be in the model's dtype: samplers compute in fp32.


_GROUPED = ("temperature", "top_k", "top_p", "min_p", "presence", "frequency")
_LATER_KEYWORDS = ("group", "pad_row", "record", "token_out")


# --- the later keywords' meaning, shared by the reference, the fused sampler and `rows_sampler` ----


def check_later_keywords(rows: int, group: int, draw: bool, has_counts: bool, record: bool,
                         token_out: torch.Tensor | None) -> None:  # fmt: skip
    """The checks every `sample_rows` makes of group, record and token_out."""
    if group < 1 or rows % group:
        raise ValueError(f"group must be >= 1 and divide the {rows} rows, got {group}")
    if record and not (draw and has_counts):
        raise ValueError("record needs seeds (a draw) and counts with count_rows")
    if token_out is not None and not draw:
        raise ValueError("token_out needs seeds (a draw)")


def each_row(t: torch.Tensor | None, group: int) -> torch.Tensor | None:
    """A per-sequence tensor (entry r // group serves row r) given row by row."""
    return t if t is None or group == 1 else t.repeat_interleave(group, 0)


def pad_count_rows(count_rows: torch.Tensor, pad_row: int | None) -> torch.Tensor:
    """Count rows < 0 (a captured step's padding rows) read `pad_row`."""
    return count_rows if pad_row is None else torch.where(count_rows < 0, pad_row, count_rows)


def sampling_logits(model: object, hidden: torch.Tensor) -> torch.Tensor:
    """The logits a captured step samples from: the head's, in the model's dtype where the model
    gives them (`head_logits`; every sampler computes in fp32 from there, exactly as from an fp32
    copy), else `compute_logits`'."""
    return getattr(model, "head_logits", model.compute_logits)(hidden)


def record_drawn(token: torch.Tensor, counts: torch.Tensor | None, count_rows: torch.Tensor | None, record: bool,
                 token_out: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """After a draw: each token added to its counts row when `record` (atomic adds: no sort, no
    host sync, padding rows may share one row), the tokens written to `token_out` when given.
    Returns the tokens (token_out itself when given)."""
    if record:
        vocab = counts.shape[-1]
        counts.view(-1).scatter_add_(0, count_rows * vocab + token, torch.ones_like(token, dtype=counts.dtype))
    return token if token_out is None else token_out.copy_(token)


def rows_sampler(sampler: object | None):
    """The `sample_rows` a captured step uses: the sampler's own, else the reference's. A
    sampler's own without the later keywords (`_LATER_KEYWORDS`) gets them done around its call:
    grouped parameters expanded to rows, padding rows mapped, tokens counted and copied out."""
    fn = getattr(sampler, "sample_rows", None)
    if fn is None:
        from ninfer.kernels.sampling import sample_rows as fn

        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if all(name in params for name in _LATER_KEYWORDS):
        return fn

    def around(logits, *args, group: int = 1, pad_row: int | None = None, record: bool = False,
               token_out: torch.Tensor | None = None, **kwargs):  # fmt: skip
        if len(args) < len(_GROUPED) + 3:
            raise ValueError("sample_rows takes logits, the six parameters, seeds, positions and purpose positionally")
        draw = args[len(_GROUPED)] is not None
        counts, count_rows = kwargs.get("counts"), kwargs.get("count_rows")
        check_later_keywords(logits.shape[0], group, draw, counts is not None and count_rows is not None, record,
                             token_out)  # fmt: skip
        args = (*(each_row(t, group) for t in args[: len(_GROUPED)]), *args[len(_GROUPED):])
        if count_rows is not None:
            kwargs["count_rows"] = count_rows = pad_count_rows(each_row(count_rows, group), pad_row)
        kwargs["extra_ids"] = each_row(kwargs.get("extra_ids"), group)
        # a sampler written before the keywords got fp32 logits; captured steps now pass the model's dtype
        ids, probs, token = fn(logits.float(), *args, **kwargs)
        return ids, probs, token if token is None else record_drawn(token, counts, count_rows, record, token_out)

    return around
