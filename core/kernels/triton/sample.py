"""The sampler's whole pipeline for a captured step in two launches (`fused_sample`).

`ninfer.kernels.sampling.sample_rows` in torch is ~100 launches after the logits (penalties, the
int64 rank keys, torch.topk's multi-block radix select over 248k entries, temperature, min-p,
top-p, a second top-k to order by probability, cumulative sums, and SplitMix64 as a dozen int64
ops): each a few µs on the GPU plus its launch gap, ~0.2 ms of a 2.7 ms 35B-A3B decode step.

Stage 1, grid (rows, chunks): each program applies the penalties to a chunk of one row's logits
(counts read in place through `count_rows`, a speculative column's earlier drafts added), makes
the order-preserving int64 keys of `sampling._rank_keys` (value descending, lower id first) and
writes the chunk's K largest keys. Stage 2, grid (rows,): the row's K largest of those, decoded
back to (value, id), then temperature, top-k, min-p, top-p and the renormalisation on a 32-wide
vector, the order by probability, the sequential CDF and the counter-based draw.

Same results as the reference: the candidates' ids exactly (the keys are exact and the penalties
are computed in the reference's order with no fused multiply-add); the probabilities to float
rounding (the reference's sums are torch reductions, ours sequential; exp and the divisions are
the IEEE ones where the device has them); the uniform bit for bit; so the same token except where
u lands within a rounding error of a CDF boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ninfer.config import TOP_K_CAP
from ninfer.kernels.triton import sync as SY
from ninfer.kernels.triton.launch import interpreting, lasting, pdl_kwargs, pdl_prologue
from ninfer.sampling import check_later_keywords

# the smallest int64: below every real key (the smallest real one, -inf's, is about -2^63 + 2^55)
_NONE = tl.constexpr(-(2**63))


@triton.jit
def _mix64(z):
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _uniform(seed, position, purpose):
    """counter_uniform of int64 seed, position, purpose (tensors or scalars): float32 in [0, 1)."""
    counter = (position * 8 + purpose).to(tl.uint64, bitcast=True)
    z = _mix64(_mix64(seed.to(tl.uint64, bitcast=True)) + (counter + 1) * 0x9E3779B97F4A7C15)
    return (z >> 40).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _rank_key(v, ids, V):
    """`sampling._rank_keys` in a kernel: int64 keys ordered like (v descending, id ascending)."""
    bits = (v + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 sorts as +0.0
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    return ordered * 4294967296 + (V - 1 - ids).to(tl.int64)


@triton.jit
def _draw(ids, probs, real, u, V, N: tl.constexpr):
    """`_inverse_cdf(*_by_probability(ids, probs))` for one row of candidates (real: the columns in
    use, at most N): ranks by probability, the sequential CDF in that order, the clamped pick."""
    pkey = tl.where(real, _rank_key(probs, ids, V), _NONE)
    rank = tl.sum((pkey[None, :] > pkey[:, None]).to(tl.int32), 1)
    cdf = tl.zeros_like(probs)
    run = 0.0
    for j in tl.static_range(N):
        run = run + tl.sum(tl.where(rank == j, probs, 0.0), 0)
        cdf = tl.where(rank == j, run, cdf)
    idx = tl.sum(((cdf <= u * run) & real).to(tl.int32), 0)
    idx = tl.minimum(idx, tl.sum((real & (probs > 0)).to(tl.int32), 0) - 1)
    return tl.sum(tl.where(rank == idx, ids, 0), 0)


@triton.jit
def _chunk_top_kernel(L, sl, C, sc, CROWS, XID, sx, XLEN, PRES, FREQ, PART, V, n_extra, pad_row,
                      CHUNK: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, HAS_COUNTS: tl.constexpr,
                      HAS_EXTRA: tl.constexpr, G: tl.constexpr = 1, HAS_PAD: tl.constexpr = False,
                      PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    g = r // G  # the row's parameter row (G rows share one: a speculative round's columns)
    c = tl.program_id(1)
    nc = tl.num_programs(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    x = tl.load(L + r * sl + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_COUNTS:
        crow = tl.load(CROWS + g)
        if HAS_PAD:  # a padding row (count row < 0) reads the pad row
            crow = tl.where(crow < 0, pad_row, crow)
        cnt = tl.load(C + crow * sc + offs, mask=ok, other=0.0)
        if HAS_EXTRA:
            n = tl.load(XLEN + r)
            for e in range(n_extra):
                xid = tl.load(XID + g * sx + e)
                cnt += tl.where((offs == xid) & (e < n), 1.0, 0.0)
        # the reference's order: (x - presence * [count > 0]) - frequency * count
        x = x - tl.load(PRES + g) * (cnt > 0).to(tl.float32)
        x = x - tl.load(FREQ + g) * cnt
    keys = tl.where(ok, _rank_key(x, offs, V), _NONE)
    base = PART + (r * nc + c) * KP
    for j in tl.static_range(K):
        m = tl.max(keys, 0)
        tl.store(base + j, m)
        keys = tl.where(keys == m, _NONE, keys)


@triton.jit
def _finish_kernel(PART, n_part, V, TEMP, TOPK, TOPP, MINP, SEEDS, POS, PURP, purpose_stride,
                   IDS, PROBS, TOKEN, C, sc, CROWS, pad_row,
                   K: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr, DRAW: tl.constexpr, LIBDEVICE: tl.constexpr,
                   G: tl.constexpr = 1, RECORD: tl.constexpr = False, HAS_PAD: tl.constexpr = False,
                   PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    g = r // G
    offs = tl.arange(0, NP)
    part = tl.load(PART + r * n_part + offs, mask=(offs < n_part) & (offs % KP < K), other=_NONE)
    cols = tl.arange(0, KP)
    top = tl.full([KP], _NONE, tl.int64)
    for j in tl.static_range(K):
        m = tl.max(part, 0)
        top = tl.where(cols == j, m, top)
        part = tl.where(part == m, _NONE, part)
    real = cols < K
    ids = (V - 1 - (top & 0xFFFFFFFF)).to(tl.int64)
    hi = (top >> 32).to(tl.int32)
    vals = tl.where(hi < 0, hi ^ 0x7FFFFFFF, hi).to(tl.float32, bitcast=True)
    vals = tl.where(real, vals, float("-inf"))
    ids = tl.where(real, ids, 0)

    t = tl.load(TEMP + g)
    top_k = tl.load(TOPK + g)
    top_p = tl.load(TOPP + g)
    min_p = tl.load(MINP + g)
    first = tl.sum(tl.where(cols == 0, vals, 0.0), 0)
    if LIBDEVICE:  # torch's expf; the interpreter has no libdevice
        w = libdevice.exp(tl.div_rn(vals - first, t))
    else:
        w = tl.exp(tl.div_rn(vals - first, t))
    w = tl.where(real & (cols < top_k), w, 0.0)
    # the reference: before = cumsum(w) - w, total = sum(w); here both from one sequential pass
    before = tl.zeros([KP], tl.float32)
    acc = 0.0
    for j in tl.static_range(K):
        wj = tl.sum(tl.where(cols == j, w, 0.0), 0)
        inc = acc + wj
        before = tl.where(cols == j, inc - wj, before)
        acc = inc
    within = ((before < top_p * acc).to(tl.int32) + (top_p >= 1.0).to(tl.int32)) > 0
    keep = (w >= min_p) & within
    keep = keep | (cols == 0)
    w = tl.where(keep, w, 0.0)
    probs = tl.div_rn(w, tl.zeros([KP], tl.float32) + tl.sum(w, 0))
    tl.store(IDS + r * K + cols, ids, mask=real)
    tl.store(PROBS + r * K + cols, probs, mask=real)
    if DRAW:
        u = _uniform(tl.load(SEEDS + r), tl.load(POS + r), tl.load(PURP + r * purpose_stride))
        tok = _draw(ids, probs, real, u, V, K)
        tl.store(TOKEN + r, tok)
        if RECORD:  # the drawn token joins the row's history (stage 1 of every row read it already)
            crow = tl.load(CROWS + g)
            if HAS_PAD:
                crow = tl.where(crow < 0, pad_row, crow)
            tl.atomic_add(C + crow * sc + tok, 1.0)


def _row_param(t: torch.Tensor, rows: int, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.shape != (rows,):
        raise ValueError(f"{name} must be a [{rows}] tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} must be {dtype} on {device}, got {t.dtype} on {t.device}")
    return t.contiguous()


def fused_sample(
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
    chunk: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`ninfer.kernels.sampling.sample_rows` in two launches: (ids [R, K], probs [R, K], token [R]
    or None when seeds is None). Per-row parameters are [R] tensors on the logits' device (float32;
    top_k, seeds, positions int64); purpose an int or an int64 [R] tensor. With `group` > 1 the
    processing parameters (temperature .. frequency, count_rows, extra_ids' rows) are given once
    per `group` consecutive rows ([R / group]), as a speculative round's columns share their
    sequence's; extra_len, seeds, positions and purpose stay per row. `pad_row`: count rows < 0
    (a captured step's padding rows) read that row instead. `record`: each drawn token is added to
    its row's counts (a decode step's history; atomic, so padding rows may share one row).
    `token_out` [R] int64: the tokens are written there (and returned). No host sync."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [rows, vocab] with a unit last stride, got {tuple(logits.shape)}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    rows, vocab = logits.shape
    dev = logits.device
    if vocab >= 2**31:
        raise ValueError(f"vocab {vocab} does not fit the kernel's 32-bit ids")
    if chunk < 32 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 32, got {chunk}")
    k = min(TOP_K_CAP, vocab)
    f32, i64 = torch.float32, torch.int64
    check_later_keywords(rows, group, seeds is not None, counts is not None and count_rows is not None, record,
                         token_out)  # fmt: skip
    groups = rows // group
    temperature = _row_param(temperature, groups, "temperature", f32, dev)
    top_k = _row_param(top_k, groups, "top_k", i64, dev)
    top_p = _row_param(top_p, groups, "top_p", f32, dev)
    min_p = _row_param(min_p, groups, "min_p", f32, dev)
    presence = _row_param(presence, groups, "presence", f32, dev)
    frequency = _row_param(frequency, groups, "frequency", f32, dev)
    draw = seeds is not None
    if draw:
        seeds = _row_param(seeds, rows, "seeds", i64, dev)
        positions = _row_param(positions, rows, "positions", i64, dev)
        if isinstance(purpose, torch.Tensor):
            purp, purpose_stride = _row_param(purpose, rows, "purpose", i64, dev), 1
        else:
            purp, purpose_stride = torch.full((1,), int(purpose), dtype=i64, device=dev), 0
    else:
        seeds = positions = purp = top_k  # unread
        purpose_stride = 0
    has_counts = counts is not None
    has_extra = extra_ids is not None
    if has_counts:
        if counts.dim() != 2 or counts.shape[1] != vocab or counts.stride(1) != 1 or counts.dtype != f32:
            raise ValueError(f"counts must be float32 [slots, {vocab}] with a unit last stride, got "
                             f"{counts.dtype} {tuple(counts.shape)}")  # fmt: skip
        if count_rows is None:
            raise ValueError("counts need count_rows (the counts row of each logits row)")
        count_rows = _row_param(count_rows, groups, "count_rows", i64, dev)
    else:
        counts, count_rows = logits, top_k  # unread
        if has_extra:
            raise ValueError("extra_ids need counts")
    if has_extra:
        if extra_len is None or extra_ids.dim() != 2 or extra_ids.shape[0] != groups or extra_ids.dtype != i64:
            raise ValueError(f"extra_ids must be int64 [{groups}, E] with extra_len [{rows}]")
        extra_len = _row_param(extra_len, rows, "extra_len", i64, dev)
        if extra_ids.stride(1) != 1:
            extra_ids = extra_ids.contiguous()
        n_extra = extra_ids.shape[1]
    else:
        extra_ids, extra_len, n_extra = top_k, top_k, 0  # unread
    if token_out is not None and (token_out.shape != (rows,) or token_out.dtype != i64 or token_out.device != dev
                                  or token_out.stride(0) != 1):
        raise ValueError(f"token_out must be a unit-stride int64 [{rows}] tensor on {dev}")
    ids = torch.empty(rows, k, dtype=i64, device=dev)
    probs = torch.empty(rows, k, dtype=f32, device=dev)
    token = token_out if token_out is not None else torch.empty(rows, dtype=i64, device=dev)
    has_pad = pad_row is not None
    if rows == 0:
        return ids, probs, token if draw else None
    chunk = min(chunk, max(32, triton.next_power_of_2(vocab)))
    n_chunks = triton.cdiv(vocab, chunk)
    kp = 32
    part = torch.empty(rows, n_chunks, kp, dtype=i64, device=dev)
    pdl = pdl_kwargs(dev)
    # no fused multiply-add: the penalties must round as the reference's separate ops do
    exact = {} if interpreting() else {"enable_fp_fusion": False}
    _chunk_top_kernel[(rows, n_chunks)](
        logits, logits.stride(0), counts, counts.stride(0), count_rows, extra_ids, extra_ids.stride(0) if has_extra else 0,
        extra_len, presence, frequency, part, vocab, n_extra, pad_row if has_pad else 0,
        CHUNK=chunk, K=k, KP=kp, HAS_COUNTS=has_counts, HAS_EXTRA=has_extra, G=group, HAS_PAD=has_pad,
        num_warps=4 if chunk <= 2048 else 8, **exact, **pdl,
    )  # fmt: skip
    # the partial keys of a row, [n_chunks, KP] with K used each: read as one flat row of n_chunks * KP
    n_part = n_chunks * kp
    _finish_kernel[(rows,)](
        part, n_part, vocab, temperature, top_k, top_p, min_p, seeds, positions, purp, purpose_stride,
        ids, probs, token, counts, counts.stride(0), count_rows, pad_row if has_pad else 0,
        K=k, KP=kp, NP=triton.next_power_of_2(n_part), DRAW=draw, LIBDEVICE=not interpreting(), G=group,
        RECORD=record, HAS_PAD=has_pad, num_warps=8, **exact, **pdl,
    )  # fmt: skip
    return ids, probs, token if draw else None


@triton.jit
def _uniform_kernel(S, P, Q, OUT, n, PDL: tl.constexpr = False, BLOCK: tl.constexpr = 256):
    pdl_prologue(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    u = _uniform(tl.load(S + offs, mask=ok, other=0), tl.load(P + offs, mask=ok, other=0),
                 tl.load(Q + offs, mask=ok, other=0))
    tl.store(OUT + offs, u, mask=ok)


def uniform(seeds: torch.Tensor, positions: torch.Tensor, purpose: int | torch.Tensor) -> torch.Tensor:
    """`ninfer.kernels.sampling.counter_uniform` in one launch (int64 tensors broadcast together)."""
    purpose = torch.as_tensor(purpose, dtype=torch.int64, device=seeds.device)
    if seeds.dtype != torch.int64 or positions.dtype != torch.int64:
        raise ValueError(f"seeds and positions must be int64, got {seeds.dtype} and {positions.dtype}")
    s, p, q = (t.contiguous() for t in torch.broadcast_tensors(seeds, positions, purpose))
    out = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    n = out.numel()
    if n:
        _uniform_kernel[(triton.cdiv(n, 256),)](s, p, q, out, n, **pdl_kwargs(s.device))
    return out


@triton.jit
def _judge_kernel(CAND, PROB, DRAFTS, SEEDS, STARTS, KEPT, ACC, COUNTS, SLOTS, V, C,
                  K: tl.constexpr, CP: tl.constexpr, HAS_COUNTS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    b = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, CP)
    real = cols < C
    seed = tl.load(SEEDS + b)
    start = tl.load(STARTS + b)
    # column i accepts d_{i+1} with probability p_i(d_{i+1}) (SPEC_ACCEPT = 2, position E+1+i)
    alive = 1
    accepted = 0
    for i in tl.static_range(K):
        d = tl.load(DRAFTS + b * K + i)
        ids = tl.load(CAND + (b * (K + 1) + i) * C + cols, mask=real, other=-1)
        pr = tl.load(PROB + (b * (K + 1) + i) * C + cols, mask=real, other=0.0)
        pd = tl.sum(tl.where(ids == d, pr, 0.0), 0)
        ok = (_uniform(seed, start + 1 + i, 2) < pd).to(tl.int32)
        alive = alive * ok
        accepted = accepted + alive
    # column `accepted`: the correction's distribution (the rejected draft removed) or the bonus's
    ids = tl.load(CAND + (b * (K + 1) + accepted) * C + cols, mask=real, other=0)
    pr = tl.load(PROB + (b * (K + 1) + accepted) * C + cols, mask=real, other=0.0)
    corrected = accepted < K
    rejected = tl.load(DRAFTS + b * K + tl.where(corrected, accepted, 0))
    rest = tl.where(ids == rejected, 0.0, pr)
    total = 0.0
    for j in tl.static_range(CP):
        total = total + tl.sum(tl.where(cols == j, rest, 0.0), 0)
    use_rest = corrected & (total > 0)
    dist = tl.where(use_rest, tl.div_rn(rest, tl.zeros([CP], tl.float32) + tl.maximum(total, 1.1754943508222875e-38)), pr)
    dist = tl.where(real, dist, 0.0)
    # the draw (SPEC_CORRECTION = 3, SPEC_BONUS = 4)
    last = _draw(ids, dist, real, _uniform(seed, start + 1 + accepted, tl.where(corrected, 3, 4)), V, CP)
    tl.store(ACC + b, accepted.to(tl.int64))
    if HAS_COUNTS:
        slot = tl.load(SLOTS + b)
    for j in tl.static_range(K + 1):
        if j < K:
            tok = tl.load(DRAFTS + b * K + j)
        else:
            tok = last
        tok = tl.where(accepted == j, last, tok)
        tl.store(KEPT + b * (K + 1) + j, tok)
        if HAS_COUNTS:
            tl.atomic_add(COUNTS + slot * V + tok, 1.0, mask=j <= accepted)


def fused_judge(
    cand: torch.Tensor,
    p: torch.Tensor,
    drafts: torch.Tensor,
    seeds: torch.Tensor,
    starts: torch.Tensor,
    vocab: int,
    counts: torch.Tensor | None = None,
    slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ninfer.speculative.judge` in one launch: acceptance, the correction or bonus draw, the kept
    tokens, and (with counts and slots) the kept tokens added to the slots' history counts."""
    b, k = drafts.shape
    if cand.shape[:2] != (b, k + 1) or p.shape != cand.shape:
        raise ValueError(f"candidates {tuple(cand.shape)} / probs {tuple(p.shape)} do not fit drafts {tuple(drafts.shape)}")
    if cand.dtype != torch.int64 or p.dtype != torch.float32 or drafts.dtype != torch.int64:
        raise ValueError("judge needs int64 candidates and drafts and float32 probabilities")
    c = cand.shape[2]
    if c > 32:
        raise ValueError(f"judge takes at most 32 candidates a column, got {c}")
    dev = cand.device
    kept = torch.empty(b, k + 1, dtype=torch.int64, device=dev)
    accepted = torch.empty(b, dtype=torch.int64, device=dev)
    if b == 0:
        return accepted, kept
    has_counts = counts is not None
    if has_counts:
        if counts.dtype != torch.float32 or counts.dim() != 2 or counts.shape[1] != vocab or not counts.is_contiguous():
            raise ValueError(f"counts must be contiguous float32 [slots, {vocab}]")
        if slots is None or slots.shape != (b,):
            raise ValueError(f"counts need slots [{b}]")
    _judge_kernel[(b,)](
        cand.contiguous(), p.contiguous(), drafts.contiguous(), seeds.contiguous(), starts.contiguous(), kept, accepted,
        counts if has_counts else p, slots.contiguous() if has_counts else seeds, vocab, c,
        K=k, CP=32, HAS_COUNTS=has_counts, num_warps=1, **pdl_kwargs(dev),
    )  # fmt: skip
    return accepted, kept


@triton.jit
def _argmax_rows_kernel(L, sl, MAP, OUT, so, PV, PI, CNT, V, NCH, CHUNK: tl.constexpr, NCHP: tl.constexpr,
                        HAS_MAP: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    i = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(L + row * sl + i, mask=i < V, other=float("-inf")).to(tl.float32)
    top = tl.max(x, 0)
    # the chunk's first maximum (a chunk of -inf only: its first index)
    tl.store(PV + row * NCH + c, top)
    tl.store(PI + row * NCH + c, tl.min(tl.where(x == top, i, V), 0).to(tl.int64))
    tl.debug_barrier()  # this program's partial is stored before it counts itself
    arrived = SY.arrive(CNT + row)
    if arrived == NCH - 1:
        SY.acquire_all(arrived)
        # the last chunk of the row to arrive: the first maximum over the chunks' partials
        j = tl.arange(0, NCHP)
        pv = tl.load(PV + row * NCH + j, mask=j < NCH, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(PI + row * NCH + j, mask=j < NCH, other=V, cache_modifier=".cg")
        idx = tl.min(tl.where(pv == tl.max(pv, 0), pi, V), 0)
        # a row with no comparable logit (all NaN) finds no maximum: V, one past the row; clamp so
        # the id map and the next step's embedding stay in bounds (torch would return a NaN's index)
        idx = tl.minimum(idx, V - 1)
        if HAS_MAP:
            idx = tl.load(MAP + idx).to(tl.int64)
        tl.store(OUT + row * so, idx)
        SY.rearm(CNT + row)


def _argmax_scratch(device: torch.device, rows: int, nch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # each row's last program puts its counter back to zero
    return lasting("argmax_rows", device, (rows, nch), lambda: (
        torch.empty(rows * nch, dtype=torch.float32, device=device),
        torch.empty(rows * nch, dtype=torch.int64, device=device),
        torch.zeros(rows, dtype=torch.int32, device=device)))  # fmt: skip


def argmax_rows(logits: torch.Tensor, id_map: torch.Tensor | None = None, out: torch.Tensor | None = None,
                chunk: int = 4096) -> torch.Tensor:
    """torch.argmax(logits, -1) for logits [B, V] (the first maximum on ties), mapped through
    `id_map` [V] when given (a shortlist head's row -> token id), in one launch with no host
    sync: a speculative draft step's proposal. Each program takes `chunk` logits of a row; the
    row's last program to finish (an atomic counter) reduces the chunks' partials, so a 131k row
    is ~32 programs reading 8 KB each rather than one program looping over 256 KB. `out` [B]
    int64 (any stride, e.g. a column of the round's [B, K] drafts) receives the ids; returned.
    NaN logits are skipped (torch would pick them); a row of NaN only gives V - 1 compiled (the
    interpreter's max propagates NaN, so there any NaN in a chunk can do that)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"argmax_rows: logits {tuple(logits.shape)} must be [B, V] with a unit last stride")
    B, V = logits.shape
    if id_map is not None and id_map.shape != (V,):
        raise ValueError(f"argmax_rows: id_map {tuple(id_map.shape)} must be [{V}]")
    if out is None:
        out = torch.empty(B, dtype=torch.int64, device=logits.device)
    elif out.shape != (B,) or out.dtype != torch.int64:
        raise ValueError(f"argmax_rows: out {tuple(out.shape)} {out.dtype} must be [{B}] int64")
    if B and V:
        chunk = min(chunk, triton.next_power_of_2(V))
        nch = triton.cdiv(V, chunk)
        pv, pi, cnt = _argmax_scratch(logits.device, B, nch)
        _argmax_rows_kernel[(B, nch)](logits, logits.stride(0), id_map if id_map is not None else logits, out,
                                      out.stride(0), pv, pi, cnt, V, nch, CHUNK=chunk,
                                      NCHP=max(2, triton.next_power_of_2(nch)), HAS_MAP=id_map is not None,
                                      num_warps=4, **pdl_kwargs(logits.device))
    return out
