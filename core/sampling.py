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
    #                 extra_len=None, group=1) -> tuple[ids, probs, token | None]
    # (`group`: parameters given once per that many consecutive rows; a sampler written before it
    # existed, without the keyword, is given them row by row by `rows_sampler`.)


_GROUPED = ("temperature", "top_k", "top_p", "min_p", "presence", "frequency")


def rows_sampler(sampler: object | None):
    """The `sample_rows` a captured step uses: the sampler's own, else the reference's. A
    sampler's own without the `group` keyword gets grouped parameters expanded to rows first."""
    fn = getattr(sampler, "sample_rows", None)
    if fn is None:
        from ninfer.kernels.sampling import sample_rows as fn

        return fn
    try:
        takes_group = "group" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_group = False
    if takes_group:
        return fn

    def expanded(logits, *args, group: int = 1, **kwargs):
        if group == 1:
            return fn(logits, *args, **kwargs)
        params = dict(zip(_GROUPED, args[: len(_GROUPED)]))
        rest = args[len(_GROUPED):]
        params = {name: t.repeat_interleave(group, 0) for name, t in params.items()}
        for name in ("count_rows", "extra_ids"):
            if kwargs.get(name) is not None:
                kwargs[name] = kwargs[name].repeat_interleave(group, 0)
        return fn(logits, *params.values(), *rest, **kwargs)

    return expanded
