"""The reference sampler: spec section 7 in plain torch, float32, batched over rows, CPU or CUDA.

Pipeline per row (spec §7), greedy rows being the same pipeline with top_k = 1 and no penalties:

    adjusted = logit - presence * [count > 0] - frequency * count   (counts: the row's history)
    candidates = the top_k (<= 20) adjusted logits, descending, lower id first on ties
    w = exp((adjusted - max) / T)                                     (so w[0] == 1 exactly)
    min_p: drop candidates with w < min_p * w[0]
    top_p: keep the shortest prefix whose cumulative w reaches top_p * sum(w over the top_k)
    renormalise, draw by inverse CDF with a counter-based uniform

Our reading of "top_p of the pre-truncation mass": the reference mass is that of the top_k
candidates after temperature and before min-p (not the full-vocabulary softmax, and not what
min-p leaves). Both min-p and top-p then cut a prefix of the same sorted list, so the result is
the shorter prefix and the two filters commute. top_p >= 1 keeps every top_k candidate (a float
cumulative sum can saturate before the last tiny weight); top_p == 0 keeps the first.

Randomness is a pure function u = f(seed, absolute position, purpose) (SplitMix64 in int64 torch
ops, wrapping mod 2^64), so no torch.Generator state exists, a request replays bit for bit
whatever it was batched with, and CPU and CUDA draw the same uniforms. Rows are drawn by inverse
CDF over their candidates ordered by probability (descending, lower id on ties): `sample` and
`draw(probs(...))` pick the same token for the same uniform.

Logits must be finite or -inf, with at least one finite entry per row: NaN or +inf is a bug
upstream (a broken checkpoint, an overflowing dtype) and raises ValueError instead of being
sampled around.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ninfer.config import TOP_K_CAP, SamplingParams
from ninfer.device import ANYWHERE
from ninfer.sampling import Purpose, check_later_keywords, each_row, pad_count_rows, record_drawn

# ---------------------------------------------------------------------------- counter RNG

_U64 = (1 << 64) - 1


def _i64(v: int) -> int:
    """A Python int as the int64 with the same low 64 bits (torch has no uint64 arithmetic)."""
    v &= _U64
    return v - (1 << 64) if v >> 63 else v


# SplitMix64 (Steele, Lea, Flood 2014): the golden-ratio increment and the two mix multipliers.
_GAMMA = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)
# 8 purposes fit under one position; Purpose has 6.
_PURPOSE_BITS = 3
_MAX_POSITION = 1 << (63 - _PURPOSE_BITS)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    # torch's >> on int64 is arithmetic; the hash needs the logical shift of the unsigned value.
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def counter_uniform(seeds: torch.Tensor, positions: torch.Tensor, purpose: int | torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1) (float32, 24 random bits) from int64 tensors of seeds and absolute
    positions (broadcast together) and a Purpose.

    The value is output number `position * 8 + purpose` of a SplitMix64 stream whose state starts
    at mix64(seed): pre-mixing the seed keeps streams of nearby seeds from being shifted copies
    of each other. Only elementwise int64 ops, so it can run inside a CUDA graph or a kernel.
    """
    counter = positions * (1 << _PURPOSE_BITS) + purpose
    z = _mix64(_mix64(seeds) + (counter + 1) * _GAMMA)
    # the top 24 bits: exactly representable in float32, and u * 2^24 is an integer
    return _shr(z, 40).to(torch.float32) * (1.0 / (1 << 24))


def uniforms(
    params: Sequence[SamplingParams], positions: Sequence[int], purpose: Purpose | int, device: torch.device | str
) -> torch.Tensor:
    """counter_uniform for one row per request: [B] float32 on `device`."""
    if len(params) != len(positions):
        raise ValueError(f"{len(params)} sampling params but {len(positions)} positions")
    if not 0 <= int(purpose) < (1 << _PURPOSE_BITS):
        raise ValueError(f"purpose {purpose!r} is outside 0..{(1 << _PURPOSE_BITS) - 1}")
    for p in positions:
        if not 0 <= p < _MAX_POSITION:
            raise ValueError(f"position {p} is outside 0..2^{63 - _PURPOSE_BITS}")
    seeds = torch.tensor([_i64(p.seed) for p in params], dtype=torch.int64, device=device)
    pos = torch.tensor(list(positions), dtype=torch.int64, device=device)
    return counter_uniform(seeds, pos, int(purpose))


# ---------------------------------------------------------------------------- ordering


def _rank_keys(values: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 keys that sort like (value descending, id ascending), all distinct.

    torch.topk and argmax leave the order of equal values unspecified (and it differs between
    devices), and a stable sort of a 248k vocabulary costs ~40 ms a row on CPU against ~0.6 ms
    for topk, so ties are broken inside the key: the float's order-preserving int32 image in the
    high half, the reversed id in the low half. Keys fit in int64 exactly: |int32| * 2^32 + 2^32-1.
    """
    bits = (values.float() + 0.0).contiguous().view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    return ordered * (1 << 32) + (vocab - 1 - ids)


def top_candidates(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row of `values` [B, V] as (ids [B, k] int64, values [B, k]),
    descending, lower id first among equal values. Deterministic on every device."""
    vocab = values.shape[-1]
    ids = torch.arange(vocab, device=values.device).expand_as(values)
    top = torch.topk(_rank_keys(values, ids, vocab), k, dim=-1, sorted=True).indices
    return top, values.gather(-1, top)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Exact argmax per row [B] int64, the lowest id on ties."""
    return top_candidates(logits, 1)[0][:, 0]


# ---------------------------------------------------------------------------- the pipeline


def process(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    counts: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The processed distribution of each row as its candidates: (ids [B, K], probs [B, K]) with
    K = min(20, V), in the pipeline's order (adjusted logit descending, lower id first), probs
    renormalised and 0 past what the filters keep. Per-row parameters are [B] tensors on the
    logits' device; top_k must already be effective (1..20); a greedy row is top_k = 1 with
    zero penalties. `counts` [B, V] are the history counts (None: no history).

    Tensor ops only (no host sync), for capture in a CUDA graph."""
    adjusted = logits.float()
    if counts is not None:
        adjusted = adjusted - presence[:, None] * (counts > 0) - frequency[:, None] * counts
    k = min(TOP_K_CAP, adjusted.shape[-1])
    ids, top = top_candidates(adjusted, k)
    col = torch.arange(k, device=logits.device)
    # -inf candidates give exp(-inf) = 0; the caller guaranteed a finite first one.
    w = torch.exp((top - top[:, :1]) / temperature[:, None])
    w = torch.where(col < top_k[:, None], w, 0.0)
    total = w.sum(-1, keepdim=True)
    before = torch.cumsum(w, -1) - w  # mass strictly before each candidate
    keep = (w >= min_p[:, None]) & ((before < top_p[:, None] * total) | (top_p[:, None] >= 1.0))
    keep[:, 0] = True
    w = torch.where(keep, w, 0.0)
    return ids, w / w.sum(-1, keepdim=True)


def _inverse_cdf(ids: torch.Tensor, probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The id whose cumulative interval holds u, over candidates ordered by probability
    (descending) so positive entries form a prefix. Zero-probability entries are never chosen:
    the strict comparison skips them and the clamp stops at the last positive one when float
    rounding pushes u * total up to the total."""
    cdf = torch.cumsum(probs, -1)
    target = u[:, None] * cdf[:, -1:]
    idx = (cdf <= target).sum(-1)
    idx = torch.minimum(idx, (probs > 0).sum(-1) - 1)
    return ids.gather(-1, idx[:, None])[:, 0]


def _by_probability(ids: torch.Tensor, probs: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates reordered by probability descending, lower id first on equal probability:
    the order `draw` uses, so sample and draw(probs) agree even where exp rounds two adjusted
    logits to one weight."""
    order = torch.topk(_rank_keys(probs, ids, vocab), probs.shape[-1], dim=-1, sorted=True).indices
    return ids.gather(-1, order), probs.gather(-1, order)


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One id per row of a distribution [B, V] for uniforms u [B], by inverse CDF over the row's
    support ordered by probability (descending, lower id on ties).

    Only the 20 largest entries are drawn from: every distribution this engine draws from is a
    processed distribution (at most 20 candidates) or a residual of one."""
    ids, p = top_candidates(probs, min(TOP_K_CAP, probs.shape[-1]))
    return _inverse_cdf(ids, p, u)


def scatter_probs(ids: torch.Tensor, probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """Candidates (ids, probs) [B, K] as a dense distribution [B, V]."""
    return torch.zeros(ids.shape[0], vocab, dtype=torch.float32, device=ids.device).scatter_(-1, ids, probs)


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    seeds: torch.Tensor | None,
    positions: torch.Tensor | None,
    purpose: int | torch.Tensor,
    *,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
    extra_ids: torch.Tensor | None = None,
    extra_len: torch.Tensor | None = None,
    group: int = 1,
    pad_row: int | None = None,
    record: bool = False,
    token_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The whole pipeline for the rows of a captured step, in tensors: (ids [R, K], probs [R, K])
    as `process` gives them, and the token each row draws with counter_uniform(seeds, positions,
    purpose) (None when seeds is None: the caller only wants the distributions).

    History: row r counts counts[count_rows[r]] (a [S, V] table: no gather copy is asked of the
    caller), plus each of extra_ids[r, :extra_len[r]] once more (a speculative verify column's
    drafts before it). With `group` > 1, temperature .. frequency, count_rows and extra_ids are
    given once per `group` consecutive rows (row r reads entry r // group: a speculative round's
    columns share their sequence's); extra_len, seeds, positions and purpose stay per row.
    `pad_row`: count rows < 0 (a captured step's padding rows) read that row. `record`: each
    drawn token is added to its row's counts after the draw (a decode step's history).
    `token_out` [R] int64: the tokens are written there and returned. Tensor ops only. This is
    the reference; `ninfer.kernels.triton.sample.fused_sample` computes the same in two launches."""
    check_later_keywords(logits.shape[0], group, seeds is not None, counts is not None and count_rows is not None,
                         record, token_out)  # fmt: skip
    temperature, top_k, top_p, min_p, presence, frequency, count_rows, extra_ids = (
        each_row(t, group) for t in (temperature, top_k, top_p, min_p, presence, frequency, count_rows, extra_ids)
    )
    rows_counts = None
    if counts is not None:
        if count_rows is None:
            raise ValueError("counts need count_rows (the counts row of each logits row)")
        count_rows = pad_count_rows(count_rows, pad_row)
        rows_counts = counts.index_select(0, count_rows)
        if extra_ids is not None:
            if extra_len is None:
                raise ValueError("extra_ids need extra_len")
            used = (torch.arange(extra_ids.shape[1], device=extra_ids.device)[None, :] < extra_len[:, None]).float()
            rows_counts = rows_counts.scatter_add(1, extra_ids, used)
    ids, probs = process(logits, temperature, top_k, top_p, min_p, presence, frequency, rows_counts)
    if seeds is None:
        return ids, probs, None
    token = draw_candidates(ids, probs, logits.shape[-1], counter_uniform(seeds, positions, purpose))
    return ids, probs, record_drawn(token, counts, count_rows, record, token_out)


def draw_candidates(ids: torch.Tensor, probs: torch.Tensor, vocab: int, u: torch.Tensor) -> torch.Tensor:
    """`draw` over a distribution given as candidates (ids, probs) [B, K] (at most K positive
    entries): the same token as draw(scatter_probs(ids, probs, vocab), u)."""
    ordered, p = _by_probability(ids, probs, vocab)
    return _inverse_cdf(ordered, p, u)


# ---------------------------------------------------------------------------- speculative accept


def point_mass_accepts(probs: torch.Tensor, draft_ids: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Batched acceptance of point-mass drafts (MTP, DFlash; spec §3.1): row b accepts
    draft_ids[b] iff u[b] < probs[b, draft_ids[b]], i.e. with probability p(draft). [B] bool."""
    return u < probs.gather(-1, draft_ids[:, None])[:, 0]


def accept_point_mass(probs_row: torch.Tensor, draft_id: int, u: float | torch.Tensor) -> bool:
    """Whether the target distribution `probs_row` [V] accepts a point-mass draft, given the
    Purpose.SPEC_ACCEPT uniform u of that position: true with probability p(draft)."""
    u_t = torch.as_tensor(u, dtype=torch.float32, device=probs_row.device).reshape(1)
    draft = torch.tensor([draft_id], dtype=torch.int64, device=probs_row.device)
    return bool(point_mass_accepts(probs_row[None], draft, u_t)[0])


def residual_without(probs_row: torch.Tensor, draft_id: int | torch.Tensor) -> torch.Tensor:
    """The distribution to draw the correction from after a point-mass draft is rejected: p with
    the draft removed, renormalised (draw it with a Purpose.SPEC_CORRECTION uniform). Works on
    [V] with an int or on [B, V] with ids [B]. Where the draft held all the mass it is never
    rejected, and p comes back unchanged rather than 0/0."""
    p = probs_row.float()
    draft = torch.as_tensor(draft_id, dtype=torch.int64, device=p.device).reshape(*p.shape[:-1], 1)
    r = p.scatter(-1, draft, 0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(torch.float32).tiny), p)


# ---------------------------------------------------------------------------- the plugin object


def _check_logits(logits: torch.Tensor) -> None:
    # one host sync; the CUDA-graph path calls `process` directly and checks nothing
    bad = torch.isnan(logits) | torch.isposinf(logits)
    if bool(bad.any() | torch.isneginf(logits).all(-1).any()):
        for row in range(logits.shape[0]):
            if bool(bad[row].any()):
                raise ValueError(
                    f"logits row {row} holds NaN or +inf: the model's output is broken (bad weights "
                    "or an overflowing dtype); try --dtype float32 or check the checkpoint."
                )
            if bool(torch.isneginf(logits[row]).all()):
                raise ValueError(f"logits row {row} is -inf everywhere: no token can be sampled.")


class ReferenceSampler:
    """ninfer.sampling.Sampler in plain torch: the oracle for tuned samplers, and the CPU path."""

    name = "reference"
    requirements = ANYWHERE

    # the captured steps' pipeline (graphs, speculative rounds): tensors in, no host sync
    sample_rows = staticmethod(sample_rows)

    def candidates(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], history: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The processed distribution as sorted candidates (ids [B, K], probs [B, K])."""
        if logits.dim() != 2:
            raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
        rows, vocab = logits.shape
        if len(params) != rows or len(history) != rows:
            raise ValueError(f"{rows} logits rows but {len(params)} sampling params and {len(history)} histories")
        _check_logits(logits)
        dev = logits.device

        def col(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=dev)

        # greedy: top_k 1 without penalties is the argmax, lowest id on ties, whatever u is
        sampled = [not p.greedy for p in params]
        temperature = col([p.temperature if s else 1.0 for p, s in zip(params, sampled)])
        top_k = torch.tensor([p.effective_top_k if s else 1 for p, s in zip(params, sampled)], device=dev)
        top_p = col([p.top_p if s else 1.0 for p, s in zip(params, sampled)])
        min_p = col([p.min_p if s else 0.0 for p, s in zip(params, sampled)])
        presence = col([p.presence_penalty if s else 0.0 for p, s in zip(params, sampled)])
        frequency = col([p.frequency_penalty if s else 0.0 for p, s in zip(params, sampled)])
        counts = None
        pairs = [(r, t) for r, (h, s) in enumerate(zip(history, sampled)) if s for t in h]
        if pairs:
            bad = [t for _, t in pairs if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"history token {bad[0]} is outside the vocabulary of {vocab}")
            idx = torch.tensor(pairs, dtype=torch.int64, device=dev)
            counts = torch.zeros(rows, vocab, dtype=torch.float32, device=dev)
            counts.index_put_((idx[:, 0], idx[:, 1]), torch.ones(len(pairs), device=dev), accumulate=True)
        return process(logits, temperature, top_k, top_p, min_p, presence, frequency, counts)

    def probs(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], history: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        ids, p = self.candidates(logits, params, history)
        return scatter_probs(ids, p, logits.shape[-1])

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        history: Sequence[Sequence[int]],
        positions: Sequence[int],
        purpose: Purpose = Purpose.DECODE,
    ) -> torch.Tensor:
        ids, p = self.candidates(logits, params, history)
        ids, p = _by_probability(ids, p, logits.shape[-1])
        return _inverse_cdf(ids, p, uniforms(params, positions, purpose, logits.device))
