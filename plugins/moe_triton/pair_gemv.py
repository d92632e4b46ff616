"""Decode MoE experts as one split-K GEMV per (token, expert) pair, on quant_int's f16x2 GEMV step.

Why: at one to four tokens the tile kernels of grouped_gemv.py pad each expert's tile to 16 pairs
for the MMA and walk K in one program: measured 37.6 µs for gate_up at T = 1 (11 MB, 7% of the
copy bandwidth; BENCHMARKS.md "35B-A3B MoE"). Here every pair p = t * slots + j (router.py) is a
GEMV of one activation row, split over K slices and row chunks like gemv_h2.py, with its decode
(`lop3` magic numbers, f16x2 FMAs, fp32 scales) and its tile and trip functions reused as they are.

Two launches per layer, no host sync, grids fixed by shapes (CUDA-graph safe):
* gate_up: grid (row chunks, K slices, pairs). A chunk is R gate rows and the same R up rows of
  the pair's expert (both read against the same x slice). The last CTA of a (pair, chunk) to
  arrive sums the slices in order and writes h = silu(gate) * up, rounded to x's dtype. With one
  K slice (kbs = H / 128) a chunk's only CTA does it, with no counter (DIRECT).
* down: grid (row chunks, K slices, pairs), x = h of the pair. The last CTA of a chunk over every
  pair and slice writes out[t, rows] = sum_j weight[t, j] * sum_s partial[t * slots + j, s]: the
  routing weights and the per-token combine are fused, in a fixed order (bit-reproducible).
The shared expert is the pair with id E (router.py), read from its own matrices in its own
format by a runtime branch (one more compiled body, no extra launch).

Weights are read once per pair: two tokens that pick the same expert read it twice, which at
T <= 4 and 8 of 256 experts costs little (the shared expert is read T times: 2 MB each at q8;
scheduling the T shared pairs first, so that they might share it in L2, measured 0.11 ms slower
a 35B round: BENCHMARKS.md twenty-fifth run).

Needs: int formats (q4/q5/q6/q8) for the routed and the shared experts, K % (128 KBS) == 0 for
both K (hidden and inner), the expert widths a multiple of the rows per trip. `supports` says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl
from ninfer.kernels.triton import sync as SY
from ninfer.kernels.triton.launch import interpreting, pdl_early_trigger, pdl_kwargs, pdl_prologue, pdl_wait
from ninfer_plugins.moe_triton.grouped_gemv import Matrix
from ninfer_plugins.quant_int import gemv_h2 as H2
from ninfer_plugins.quant_int import kernels as QK

# the largest token count the pair kernels serve (one row per pair: past this the tile kernels,
# which read an expert once for all its tokens, win)
PAIR_MAX = 4


@dataclass(frozen=True)
class PairConfig:
    block_n: int = 32  # rows a trip
    kbs: int = 4  # K blocks of 128 per slice
    rows: int = 32  # rows a chunk (gate_up: R gate and R up rows)
    num_warps: int = 4

    def describe(self) -> str:
        return f"pair BN{self.block_n} KBS{self.kbs} R{self.rows} w{self.num_warps}"


# Defaults: gate_up in one K slice (the whole of H: each chunk of 8 gate and 8 up rows is one CTA's,
# finished there with no counter, DIRECT) and down in chunks of 16 rows. On the 35B (H 2048, I 512)
# on an H100 (bench/next_session.sh go7, 2026-12-06, each alternated twice in one process): the
# plain int4 step 2.363 -> 2.262 ms and the MTP round 4.717 -> 4.467 ms for gate_up; down's chunks
# -0.01 ms more on each. The former defaults (the H200 sweep's winners of 2026-12-03: gate_up
# BN32 KBS2 R32 w2, down BN32 KBS4 R32 w2) stay as SPLIT_GATE_UP / WIDE_DOWN, tested alternatives
# (test_gpu_earlier_pair_configs_equal_the_oracle), as do the first choices.
GATE_UP = PairConfig(block_n=8, kbs=16, rows=8, num_warps=4)
DOWN = PairConfig(block_n=16, kbs=4, rows=16, num_warps=2)
# One token (the plain decode step, the drafter's steps) may take its own configs (None: the
# above), NINFER_PAIR_GATE_UP1 / NINFER_PAIR_DOWN1 to try others. Down in 8-row chunks at one token:
# the 35B plain step -0.017 and -0.018 ms on an H100 in two calls (2026-12-06, BENCHMARKS.md
# twenty-seventh run), the MTP round unchanged; gate_up 4:16:4:2 at one token was within noise.
GATE_UP1: PairConfig | None = None
DOWN1: PairConfig | None = PairConfig(block_n=8, kbs=4, rows=8, num_warps=2)
SPLIT_GATE_UP = PairConfig(block_n=32, kbs=2, rows=32, num_warps=2)
WIDE_DOWN = PairConfig(block_n=32, kbs=4, rows=32, num_warps=2)
FIRST_GATE_UP = PairConfig(block_n=32, kbs=4, rows=32)
FIRST_DOWN = PairConfig(block_n=32, kbs=2, rows=64)


def one_slice_candidates(hidden: int) -> list[PairConfig]:
    """gate_up configs of one K slice (kbs = hidden / 128) that bench/moe.py's pair sweep times
    and the GPU tests check; sm_90 registers under Triton 3.6, q4 routed / q8 shared: 8:16:8 w4
    72, w2 128; 8:16:16 w4 128; 16:16:16 w4 168."""
    kbs = hidden // 128
    return [PairConfig(8, kbs, 8, 4), PairConfig(8, kbs, 8, 2), PairConfig(8, kbs, 16, 4), PairConfig(16, kbs, 16, 4)]


# down configs of fewer rows a chunk (more CTAs: 576 at T = 1 ran at 12% occupancy, Nsight
# Compute), as above; sm_90 registers, q5 / q8 shared: 16:4:16 w2 72, w4 64; 8:4:16 w2 72; 8:4:8 w2 54
SMALL_DOWN_CANDIDATES = (PairConfig(16, 4, 16, 2), PairConfig(16, 4, 16, 4), PairConfig(8, 4, 16, 2),
                         PairConfig(8, 4, 8, 2))


def _env_config(name: str) -> PairConfig | None:
    """A PairConfig from the environment, "block_n:kbs:rows:warps" (an A/B switch read at each
    call); None when unset."""
    v = os.environ.get(name, "")
    if not v:
        return None
    try:
        bn, kbs, rows, w = (int(t) for t in v.split(":"))
    except ValueError:
        raise ValueError(f"{name}={v!r}: expected block_n:kbs:rows:warps, e.g. 8:16:8:4") from None
    return PairConfig(bn, kbs, rows, w)


def configs_for(hidden: int, inner: int, tokens: int = 0) -> tuple[PairConfig, PairConfig] | None:
    """(gate_up, down) configs for a layer's widths: GATE_UP / DOWN (or NINFER_PAIR_GATE_UP /
    NINFER_PAIR_DOWN, "block_n:kbs:rows:warps") where they divide the shapes, else the same with
    fewer K blocks a slice or fewer rows a chunk; None if nothing fits. A gate_up whose slice is
    the whole of K (kbs = hidden / 128, e.g. 8:16:8:4 at the 35B's 2048) finishes each chunk in
    its only CTA, without a counter (`_gate_up_item`'s DIRECT). tokens == 1: the one-token
    configs (GATE_UP1 / DOWN1, NINFER_PAIR_GATE_UP1 / NINFER_PAIR_DOWN1) where set."""
    out = []
    gu_env, dn_env = _env_config("NINFER_PAIR_GATE_UP"), _env_config("NINFER_PAIR_DOWN")
    gu0, dn0 = gu_env or GATE_UP, dn_env or DOWN
    if tokens == 1:  # the one-token configs: given for one token, else given for all, else the defaults
        gu0 = _env_config("NINFER_PAIR_GATE_UP1") or gu_env or GATE_UP1 or GATE_UP
        dn0 = _env_config("NINFER_PAIR_DOWN1") or dn_env or DOWN1 or DOWN
    for base, k, rows in ((gu0, hidden, inner), (dn0, inner, hidden)):
        # the configured K blocks a slice, else one slice of the whole of K if that is fewer, else fewer
        kbs = next((b for b in (base.kbs, k // 128, 8, 4, 2, 1) if 0 < b <= base.kbs and k % (128 * b) == 0), None)
        chunk = next((r for r in (base.rows, 32) if r <= base.rows and rows % r == 0 and r % base.block_n == 0), None)
        if kbs is None or chunk is None:
            return None
        # fewer K blocks may leave a tile too small for the warps (q4's 16 words a block of 128,
        # 4 a thread): halve them until it covers them (`_fits`)
        warps = base.num_warps
        while warps > 1 and kbs * 16 * base.block_n < 128 * warps:
            warps //= 2
        out.append(PairConfig(base.block_n, kbs, chunk, warps))
    return out[0], out[1]


@triton.jit
def _slice_partials(X_row, W0, H0, S0, W1, H1, S1, sw, sh, ss, WS_p, N_SLICES, pid_s, ws_row0, ws_off1, rows,
                    SEGS: tl.constexpr, FMT: tl.constexpr, BLOCK_N: tl.constexpr, KBS: tl.constexpr,
                    HEAD: tl.constexpr, ASM: tl.constexpr, CONSTR: tl.constexpr, FAST: tl.constexpr,
                    PRELOAD: tl.constexpr, WAIT: tl.constexpr):
    """Partials of x_row's K slice `pid_s` against `rows` rows from W0 (and SEGS = 2: as many from
    W1), pointers already at the chunk's first row, stored to WS_p rows ws_row0.. (W1's at
    ws_row0 + ws_off1), laid out as gemv_h2's workspace: [row, slice, 4] with lane 0 used.
    PRELOAD (SEGS = 1): the tile is requested before x is read and prepared, so the weights are
    in flight during x's round trip (else after it); WAIT (with PRELOAD): the PDL wait sits
    between the two, so the weights stream during the previous kernel (the caller must know its
    expert without reading anything that kernel writes)."""
    w_cols, g_cols, h_cols, h_shift, lead, jj, base = H2.slice_columns(pid_s, FMT, KBS)
    rn = tl.arange(0, BLOCK_N)
    rn64 = rn.to(tl.int64)[None, :]
    if PRELOAD:
        tl.static_assert(SEGS == 1, "the pair kernels preload one segment's tile (the down kernel's)")
        w_a, hl_a, hh_a, s_a = H2._load_tile(W0 + rn64 * sw + w_cols[:, None], S0 + rn64 * ss + g_cols[:, None],
                                             H0 + rn64 * sh + h_cols[:, None], h_shift, lead, FMT, FAST)
        pdl_wait(WAIT)
    xa, xb, xc, xd, p0, p1, p2, p3, inv0 = H2._xrow_prep(X_row, 0, 0, 1, base, FMT, HEAD, FAST, 0, False)
    cols4 = tl.arange(0, 4)[:, None]
    inv = tl.where(cols4 == 0, inv0, 0.0)
    for seg in tl.static_range(SEGS):
        if seg == 0:
            wp = W0 + rn64 * sw + w_cols[:, None]
            sp = S0 + rn64 * ss + g_cols[:, None]
            hp = H0 + rn64 * sh + h_cols[:, None]
            r_base = ws_row0
        else:
            wp = W1 + rn64 * sw + w_cols[:, None]
            sp = S1 + rn64 * ss + g_cols[:, None]
            hp = H1 + rn64 * sh + h_cols[:, None]
            r_base = ws_row0 + ws_off1
        if PRELOAD:
            w_n, hl_n, hh_n, s_n = w_a, hl_a, hh_a, s_a
        else:
            w_n, hl_n, hh_n, s_n = H2._load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
        for r0 in range(0, rows, BLOCK_N):
            w = w_n
            hl = hl_n
            hh = hh_n
            s = s_n
            # the next trip's tile (or this one again after the last: stays in bounds)
            step = tl.where(r0 + BLOCK_N < rows, BLOCK_N, 0).to(tl.int64)
            wp += step * sw
            sp += step * ss
            hp += step * sh
            w_n, hl_n, hh_n, s_n = H2._load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
            H2._trip(w, hl, hh, s, r_base + r0, rn, r_base + rows, h_shift, jj, cols4, inv, WS_p, N_SLICES, pid_s,
                     xa, xb, xc, xd, p0, p1, p2, p3, xa, xb, xc, xd, p0, p1, p2, p3,
                     xa, xb, xc, xd, p0, p1, p2, p3, xa, xb, xc, xd, p0, p1, p2, p3,
                     FMT, 1, ASM, CONSTR, FAST)


@triton.jit
def _row_gscale(routed_ptr, shared_ptr, is_shared, FMT: tl.constexpr, SFMT: tl.constexpr):
    """Per element: the NVFP4 global scale of its row, from the routed or the shared expert's
    array as `is_shared` says, where that side is NVFP4; 1 elsewhere (nothing loaded)."""
    f = is_shared.to(tl.float32) * 0.0 + 1.0
    if FMT == 16:
        f = tl.where(is_shared, f, tl.load(routed_ptr, mask=~is_shared, other=1.0))
    if SFMT == 16:
        f = tl.where(is_shared, tl.load(shared_ptr, mask=is_shared, other=1.0), f)
    return f


@triton.jit
def _ws_sum(WS_p, rows, N_SLICES, SLICES_P2: tl.constexpr):
    """sum over slices of WS_p[rows, slice, 0] -> fp32 [BLOCK_N] (in slice order)."""
    sl = tl.arange(0, SLICES_P2)[:, None]
    p = tl.load(WS_p + (rows[None, :].to(tl.int64) * N_SLICES + sl) * 4, mask=sl < N_SLICES, other=0.0,
                cache_modifier=".cg")
    return tl.sum(p, 0)


@triton.jit
def _gate_up_finish(HOUT, ws_p, p, e, row0, WG, GWG, UWG, INNER, E, N_SLICES, sh_out,
                    FMT: tl.constexpr, SFMT: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                    SLICES_P2: tl.constexpr):
    """h = silu(gate) * up over a chunk's rows from its slices' partials (summed in slice order)."""
    rn = tl.arange(0, BLOCK_N)
    for r0 in range(row0, row0 + ROWS, BLOCK_N):
        rr = r0 + rn
        g = _ws_sum(ws_p, rr, N_SLICES, SLICES_P2)
        u = _ws_sum(ws_p, rr + INNER, N_SLICES, SLICES_P2)
        if FMT == 16 or SFMT == 16:
            # NVFP4: each row's global scale (1 for the other side's format)
            eg = e.to(tl.int64) * 2 * INNER + rr
            is_s = (rr * 0 + e) == E
            g = g * _row_gscale(WG + eg, GWG + rr, is_s, FMT, SFMT)
            u = u * _row_gscale(WG + eg + INNER, UWG + rr, is_s, FMT, SFMT)
        h = g * tl.sigmoid(g) * u
        tl.store(HOUT + p.to(tl.int64) * sh_out + rr, h.to(HOUT.dtype.element_ty))


@triton.jit
def _gate_up_item(X, HOUT, WS, CNT, p, e, pid_c, pid_s,
                  W, WH, WS_, GW, GWH, GWS, UW, UWH, UWS, WG, GWG, UWG,
                  INNER, E, SLOTS, N_SLICES, CHUNKS,
                  sx, sh_out, sw, swh, sws, sgw, sgwh, sgws,
                  FMT: tl.constexpr, SFMT: tl.constexpr, BLOCK_N: tl.constexpr, KBS: tl.constexpr, ROWS: tl.constexpr,
                  SLICES_P2: tl.constexpr, HEAD: tl.constexpr, SHEAD: tl.constexpr,
                  ASM: tl.constexpr, CONSTR: tl.constexpr, SASM: tl.constexpr, SCONSTR: tl.constexpr,
                  FAST: tl.constexpr, DIRECT: tl.constexpr = False):
    """One CTA of gate_up: pair p (expert e; e == E: the shared expert), row chunk pid_c, K slice
    pid_s. Returns whether this CTA was the chunk's last to arrive (it wrote the chunk's h).
    DIRECT (one K slice, N_SLICES == 1): the CTA is its chunk's only one; it reads its own
    partials back after a barrier and writes h, with no counter (no release, no atomic)."""
    tok = p // SLOTS
    x_row = X + tok.to(tl.int64) * sx
    row0 = pid_c * ROWS
    # this pair's workspace: [2 * INNER rows (gate, then up), slices, 4]
    ws_p = WS + p.to(tl.int64) * (2 * INNER) * N_SLICES * 4
    if e == E:
        r64 = row0.to(tl.int64)
        _slice_partials(x_row, GW + r64 * sgw, GWH + r64 * sgwh, GWS + r64 * sgws,
                        UW + r64 * sgw, UWH + r64 * sgwh, UWS + r64 * sgws, sgw, sgwh, sgws,
                        ws_p, N_SLICES, pid_s, row0, INNER, ROWS,
                        2, SFMT, BLOCK_N, KBS, SHEAD, SASM, SCONSTR, FAST, False, False)
    else:
        g64 = e.to(tl.int64) * 2 * INNER + row0
        u64 = g64 + INNER
        _slice_partials(x_row, W + g64 * sw, WH + g64 * swh, WS_ + g64 * sws,
                        W + u64 * sw, WH + u64 * swh, WS_ + u64 * sws, sw, swh, sws,
                        ws_p, N_SLICES, pid_s, row0, INNER, ROWS,
                        2, FMT, BLOCK_N, KBS, HEAD, ASM, CONSTR, FAST, False, False)
    tl.debug_barrier()
    if DIRECT:
        # the barrier made every thread's partials visible to the CTA (stores go through to the
        # L2, which the .cg loads read)
        _gate_up_finish(HOUT, ws_p, p, e, row0, WG, GWG, UWG, INNER, E, 1, sh_out,
                        FMT, SFMT, BLOCK_N, ROWS, 1)
        last = pid_s == 0
    else:
        cnt = CNT + p * CHUNKS + pid_c
        arrived = SY.arrive(cnt)
        last = arrived == N_SLICES - 1
        if last:
            SY.acquire_all(arrived)
            _gate_up_finish(HOUT, ws_p, p, e, row0, WG, GWG, UWG, INNER, E, N_SLICES, sh_out,
                            FMT, SFMT, BLOCK_N, ROWS, SLICES_P2)
            SY.rearm(cnt)
    return last


@triton.jit(do_not_specialize=["N_SLICES", "CHUNKS"])
def _pair_gate_up_kernel(
    X, IDS, HOUT, WS, CNT,
    W, WH, WS_, GW, GWH, GWS, UW, UWH, UWS, WG, GWG, UWG,
    INNER, E, SLOTS, N_SLICES, CHUNKS,
    sx, sh_out, sw, swh, sws, sgw, sgwh, sgws,
    FMT: tl.constexpr, SFMT: tl.constexpr, BLOCK_N: tl.constexpr, KBS: tl.constexpr, ROWS: tl.constexpr,
    SLICES_P2: tl.constexpr, HEAD: tl.constexpr, SHEAD: tl.constexpr,
    ASM: tl.constexpr, CONSTR: tl.constexpr, SASM: tl.constexpr, SCONSTR: tl.constexpr, FAST: tl.constexpr,
    PDL: tl.constexpr = False, DIRECT: tl.constexpr = False,
):
    pdl_prologue(PDL)
    p = tl.program_id(2)
    _gate_up_item(X, HOUT, WS, CNT, p, tl.load(IDS + p), tl.program_id(0), tl.program_id(1),
                  W, WH, WS_, GW, GWH, GWS, UW, UWH, UWS, WG, GWG, UWG,
                  INNER, E, SLOTS, N_SLICES, CHUNKS, sx, sh_out, sw, swh, sws, sgw, sgwh, sgws,
                  FMT, SFMT, BLOCK_N, KBS, ROWS, SLICES_P2, HEAD, SHEAD, ASM, CONSTR, SASM, SCONSTR, FAST, DIRECT)


@triton.jit
def _down_item(HIN, IDS, WEIGHTS, OUT, WS, CNT, p, e, pid_c, pid_s,
               W, WH, WS_, SW, SWH, SWS, WG, SWG, RES, NW, HOUT,
               N, E, SLOTS, N_SLICES, N_PAIRS, T, N_CHUNKS,
               shin, so, sw, swh, sws, ssw, sswh, ssws, sres, shout, eps,
               FMT: tl.constexpr, SFMT: tl.constexpr, BLOCK_N: tl.constexpr, KBS: tl.constexpr, ROWS: tl.constexpr,
               SLICES_P2: tl.constexpr, SLOTS_P2: tl.constexpr, HEAD: tl.constexpr, SHEAD: tl.constexpr,
               ASM: tl.constexpr, CONSTR: tl.constexpr, SASM: tl.constexpr, SCONSTR: tl.constexpr,
               FAST: tl.constexpr, ADD_NORM: tl.constexpr, FRESH: tl.constexpr,
               PRELOAD: tl.constexpr, WAIT: tl.constexpr, TP: tl.constexpr = 0):
    """One CTA of down: pair p (expert e), row chunk pid_c, K slice pid_s; the chunk's last CTA
    over every pair and slice combines (returns whether this CTA did). FRESH: ids and weights were written during this launch
    (the fused block): the combine reads them past L1. PRELOAD / WAIT: _slice_partials's (WAIT:
    this CTA has not waited yet; its weight tile loads before the wait). TP (a power of two >= T,
    int formats): the combine loads every token's partials at once, [TP, slot x slice, rows], one
    round trip for all T; 0: a token at a time."""
    x_row = HIN + p.to(tl.int64) * shin
    row0 = pid_c * ROWS
    ws_p = WS + p.to(tl.int64) * N * N_SLICES * 4
    if e == E:
        r64 = row0.to(tl.int64)
        _slice_partials(x_row, SW + r64 * ssw, SWH + r64 * sswh, SWS + r64 * ssws, SW, SWH, SWS, ssw, sswh, ssws,
                        ws_p, N_SLICES, pid_s, row0, 0, ROWS,
                        1, SFMT, BLOCK_N, KBS, SHEAD, SASM, SCONSTR, FAST, PRELOAD, WAIT)
    else:
        r64 = e.to(tl.int64) * N + row0
        _slice_partials(x_row, W + r64 * sw, WH + r64 * swh, WS_ + r64 * sws, W, WH, WS_, sw, swh, sws,
                        ws_p, N_SLICES, pid_s, row0, 0, ROWS,
                        1, FMT, BLOCK_N, KBS, HEAD, ASM, CONSTR, FAST, PRELOAD, WAIT)
    tl.debug_barrier()
    arrived = SY.arrive(CNT + pid_c)
    combines = arrived == N_PAIRS * N_SLICES - 1
    if combines:
        SY.acquire_all(arrived)
        # every slot and slice of a token in one load ([slot x slice, the chunk's rows]), and with
        # TP every token's in one ([TP, slot x slice, rows]): the tail this CTA adds is one round
        # trip for all T, not one a token (offsets are small: int32)
        rr = row0 + tl.arange(0, ROWS)
        js = tl.arange(0, SLOTS_P2 * SLICES_P2)
        j = js // SLICES_P2
        sl = js % SLICES_P2
        ok = (j < SLOTS) & (sl < N_SLICES)
        if TP > 0:
            tl.static_assert(FMT != 16 and SFMT != 16, "the one-load combine has no NVFP4 row scales")
            tt = tl.arange(0, TP)
            qq = tt[:, None] * SLOTS + j[None, :]
            live = (tt < T)[:, None] & (j < SLOTS)[None, :]
            if FRESH:
                wts = tl.load(WEIGHTS + qq, mask=live, other=0.0, cache_modifier=".cg")
            else:
                wts = tl.load(WEIGHTS + qq, mask=live, other=0.0)
            parts = tl.load(WS + ((qq * N)[:, :, None] + rr[None, None, :]) * (N_SLICES * 4) + (sl * 4)[None, :, None],
                            mask=(live & ok[None, :])[:, :, None], other=0.0, cache_modifier=".cg")
            acc3 = tl.sum(parts * wts[:, :, None], 1)
            tl.store(OUT + tt[:, None] * so + rr[None, :], acc3.to(OUT.dtype.element_ty), mask=(tt < T)[:, None])
        else:
            for t in range(0, T):
                q = t * SLOTS + j
                if FRESH:
                    wt = tl.load(WEIGHTS + q, mask=j < SLOTS, other=0.0, cache_modifier=".cg")
                else:
                    wt = tl.load(WEIGHTS + q, mask=j < SLOTS, other=0.0)
                part = tl.load(WS + ((q * N)[:, None] + rr[None, :]) * (N_SLICES * 4) + (sl * 4)[:, None],
                               mask=ok[:, None], other=0.0, cache_modifier=".cg")
                if FMT == 16 or SFMT == 16:
                    if FRESH:
                        eq = tl.load(IDS + q, mask=j < SLOTS, other=0, cache_modifier=".cg")
                    else:
                        eq = tl.load(IDS + q, mask=j < SLOTS, other=0)
                    is_s = (eq == E)[:, None] & (rr[None, :] >= 0)
                    eq = tl.where(eq == E, 0, eq)  # the shared pair's routed address is never read
                    f = _row_gscale(WG + (eq.to(tl.int64) * N)[:, None] + rr[None, :], SWG + rr[None, :], is_s, FMT, SFMT)
                    part = part * tl.where(ok[:, None], f, 0.0)
                acc = tl.sum(part * wt[:, None], 0)
                tl.store(OUT + t * so + rr, acc.to(OUT.dtype.element_ty))
        SY.rearm(CNT + pid_c)
        if ADD_NORM:
            # the last chunk to finish: the block's residual add and norm over the combined rows
            tl.debug_barrier()
            done = SY.arrive(CNT + N_CHUNKS)
            if done == N_CHUNKS - 1:
                SY.acquire_all(done)
                H2._add_norm_rows(OUT, RES, NW, HOUT, T, N, so, sres, shout, eps, 4)  # 4: PAIR_MAX
                SY.rearm(CNT + N_CHUNKS)
    return combines


@triton.jit(do_not_specialize=["N_SLICES", "N_PAIRS", "T", "N_CHUNKS"])
def _pair_down_kernel(
    HIN, IDS, WEIGHTS, OUT, WS, CNT,
    W, WH, WS_, SW, SWH, SWS, WG, SWG, RES, NW, HOUT,
    N, E, SLOTS, N_SLICES, N_PAIRS, T, N_CHUNKS,
    shin, so, sw, swh, sws, ssw, sswh, ssws, sres, shout, eps,
    FMT: tl.constexpr, SFMT: tl.constexpr, BLOCK_N: tl.constexpr, KBS: tl.constexpr, ROWS: tl.constexpr,
    SLICES_P2: tl.constexpr, SLOTS_P2: tl.constexpr, HEAD: tl.constexpr, SHEAD: tl.constexpr,
    ASM: tl.constexpr, CONSTR: tl.constexpr, SASM: tl.constexpr, SCONSTR: tl.constexpr, FAST: tl.constexpr,
    ADD_NORM: tl.constexpr = False, EARLY: tl.constexpr = False, PDL: tl.constexpr = False,
    TP: tl.constexpr = 0,
):
    p = tl.program_id(2)
    if EARLY:
        # after a gate_up launched EARLY: this CTA was scheduled once the router had completed,
        # so its pair's expert id (read past L1) and weight tile are loaded before the wait on
        # gate_up, and stream while gate_up finishes
        pdl_early_trigger(PDL)
        e = tl.load(IDS + p, cache_modifier=".cg")
    else:
        pdl_prologue(PDL)
        e = tl.load(IDS + p)
    _down_item(HIN, IDS, WEIGHTS, OUT, WS, CNT, p, e, tl.program_id(0), tl.program_id(1),
               W, WH, WS_, SW, SWH, SWS, WG, SWG, RES, NW, HOUT,
               N, E, SLOTS, N_SLICES, N_PAIRS, T, N_CHUNKS,
               shin, so, sw, swh, sws, ssw, sswh, ssws, sres, shout, eps,
               FMT, SFMT, BLOCK_N, KBS, ROWS, SLICES_P2, SLOTS_P2, HEAD, SHEAD, ASM, CONSTR, SASM, SCONSTR,
               FAST, ADD_NORM, False, EARLY, PDL, TP)


# --- host side --------------------------------------------------------------------------------------


def formats() -> tuple[int, ...]:
    """The weight formats the pair kernels take: quant_int's and NVFP4 (gemv_h2's decode of it,
    checked on the H200 by test_gpu_nvfp4_pairs_real_shapes)."""
    return H2.DECODES


def _fits(m: Matrix, k: int, rows: int, cfg: PairConfig) -> bool:
    if m.fmt not in formats():
        return False
    words = cfg.kbs * H2.WORDS[m.fmt] * cfg.block_n
    return (k % (128 * cfg.kbs) == 0 and rows % cfg.rows == 0 and cfg.rows % cfg.block_n == 0
            and words >= 4 * 32 * cfg.num_warps)


def supports(routed_gu: Matrix, routed_dn: Matrix, shared: tuple[Matrix, Matrix, Matrix] | None,
             hidden: int, inner: int, shared_inner: int) -> bool:
    """Whether a layer's experts (and its shared expert) can take the pair kernels (with the
    configs of one token and of more)."""
    every = (configs_for(hidden, inner, 1), configs_for(hidden, inner))
    if shared is None or shared_inner != inner or None in every:
        return False
    sg, su, sd = shared
    if [t.stride(0) if t is not None else None for t in (sg.q, sg.h, sg.s)] != [
            t.stride(0) if t is not None else None for t in (su.q, su.h, su.s)]:
        return False  # gate_up reads both with one set of row strides
    return sg.fmt == su.fmt and all(
        _fits(routed_gu, hidden, inner, gu) and _fits(sg, hidden, inner, gu) and _fits(su, hidden, inner, gu)
        and _fits(routed_dn, inner, hidden, dn) and _fits(sd, inner, hidden, dn) for gu, dn in every)


def _check(cfg: PairConfig, k: int, rows: int, what: str) -> None:
    """A config given to a launch must tile its matrix: whole K slices, whole chunks, whole trips."""
    if k % (128 * cfg.kbs) or rows % cfg.rows or cfg.rows % cfg.block_n:
        raise ValueError(f"pair {what}: {cfg.describe()} does not tile K {k} x {rows} rows (K a multiple of "
                         f"128 kbs, rows of the chunk, the chunk of block_n)")


def _int_args(m: Matrix) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(words int32, high-bit words, scales) as gemv_h2 reads them."""
    w = m.q.view(torch.int32)
    h = m.h.view(torch.int32) if m.h is not None else w
    return w, h, H2.scales_view(m.fmt, m.s)


def _workspace(pairs: int, rows: int, n_slices: int, counters: int) -> tuple[int, int]:
    return pairs * rows * n_slices * 4, counters


def _gate_up_counters(pairs: int, inner: int, hidden: int, cfg: PairConfig) -> int:
    """gate_up's counters: one a (pair, chunk); none with one K slice (DIRECT)."""
    return 0 if hidden == 128 * cfg.kbs else pairs * (inner // cfg.rows)


def workspace_need(tokens: int, slots: int, hidden: int, inner: int) -> tuple[int, int]:
    """(fp32 partials, counters) the two launches need at `tokens` tokens."""
    need = (0, 0)
    pairs = tokens * slots
    for t in {1, tokens}:  # a smaller count may take the one-token configs, with more slices
        gu, dn = configs_for(hidden, inner, t) or (GATE_UP, DOWN)
        a = _workspace(pairs, 2 * inner, hidden // (128 * gu.kbs), _gate_up_counters(pairs, inner, hidden, gu))
        b = _workspace(pairs, hidden, inner // (128 * dn.kbs), hidden // dn.rows + 1)  # + the add+norm's counter
        need = (max(need[0], a[0], b[0]), max(need[1], a[1], b[1]))
    return need


def reserve(device: torch.device, slots: int, hidden: int, inner: int) -> None:
    """Size quant_int's split-K workspace for up to PAIR_MAX tokens (outside any graph capture)."""
    if device.type == "cuda":
        QK.Workspace.get(device).reserve(*workspace_need(PAIR_MAX, slots, hidden, inner))


def early() -> bool:
    """On by default (NINFER_MOE_EARLY=0 turns it off; read at each call): gate_up lets the down launch
    go only past its PDL wait (PDL = 2, launch.late_dependents), and down loads its expert id and
    weight tile before its own wait, and so before preparing x. A down launched early must follow
    a gate_up launched early (TritonMoe.run passes one value to both). The 35B-A3B int4 step,
    H100 (BENCHMARKS.md twenty-third run): 399.1 tok/s against 391.6 / 387.5 as committed."""
    return os.environ.get("NINFER_MOE_EARLY", "1") != "0"


def combine_width(tokens: int, fmt: int, shared_fmt: int) -> int:
    """The down combine's token width (`_down_item`'s TP): every token's partials in one load for
    2 to PAIR_MAX tokens (the default); 0, a token at a time, for one token, for NVFP4 (its per-row global scales),
    for q6 (sm_90 under Triton 3.9, the CI's: the whole launch took 231-235 registers against 168
    with the loop, q4 / q5 / q8 +0-4; under 3.6, the lent GPU's, 96-128 either way), or with
    NINFER_MOE_COMBINE_LOOP=1 (an A/B switch, read at each launch)."""
    if (tokens < 2 or tokens > PAIR_MAX or 16 in (fmt, shared_fmt) or 6 in (fmt, shared_fmt)
            or os.environ.get("NINFER_MOE_COMBINE_LOOP", "0") == "1"):
        return 0  # (one token: one round trip either way, and its bits stay the loop's)
    return triton.next_power_of_2(tokens)


def _fast(fast: bool | None) -> bool:
    return (True if fast is None else fast) and not interpreting()


def gate_up(x: torch.Tensor, ids: torch.Tensor, routed: Matrix, shared_gate: Matrix, shared_up: Matrix,
            inner: int, num_experts: int, cfg: PairConfig | None = None, fast: bool | None = None,
            early_down: bool | None = None) -> torch.Tensor:
    """h [T * slots, I] = silu(G_e x_t) * U_e x_t for every pair (e = ids[t, j]; e == E: shared).
    early_down (default: `early()`): the down launch that follows will be launched early."""
    T, slots = ids.shape
    pairs = T * slots
    hidden = x.shape[1]
    cfg = cfg or configs_for(hidden, inner, T)[0]
    _check(cfg, hidden, inner, "gate_up")
    h = torch.empty(pairs, inner, dtype=x.dtype, device=x.device)
    if pairs == 0:
        return h
    n_slices = hidden // (128 * cfg.kbs)
    chunks = inner // cfg.rows
    ws = QK.Workspace.get(x.device)
    ws.ensure(*_workspace(pairs, 2 * inner, n_slices, _gate_up_counters(pairs, inner, hidden, cfg)), QK.capturing(x))
    w, wh, wsc = _int_args(routed)
    gw, gwh, gws = _int_args(shared_gate)
    uw, uwh, uws = _int_args(shared_up)
    if (gw.stride(0), gwh.stride(0), gws.stride(0)) != (uw.stride(0), uwh.stride(0), uws.stride(0)):
        raise ValueError("the shared expert's gate and up weights must share their row strides")
    asm, constr = H2._asm(routed.fmt, 1)
    sasm, sconstr = H2._asm(shared_gate.fmt, 1)
    _pair_gate_up_kernel[(chunks, n_slices, pairs)](
        x, ids, h, ws.partials, ws.counters,
        w, wh, wsc, gw, gwh, gws, uw, uwh, uws, routed.gscale(), shared_gate.gscale(), shared_up.gscale(),
        inner, num_experts, slots, n_slices, chunks,
        x.stride(0), h.stride(0), w.stride(0), wh.stride(0), wsc.stride(0), gw.stride(0), gwh.stride(0), gws.stride(0),
        FMT=routed.fmt, SFMT=shared_gate.fmt, BLOCK_N=cfg.block_n, KBS=cfg.kbs, ROWS=cfg.rows,
        SLICES_P2=triton.next_power_of_2(n_slices), HEAD=H2.HEAD[routed.fmt], SHEAD=H2.HEAD[shared_gate.fmt],
        ASM=asm, CONSTR=constr, SASM=sasm, SCONSTR=sconstr, FAST=_fast(fast), DIRECT=n_slices == 1,
        num_warps=cfg.num_warps,
        # early: the down launch after this one is scheduled only past this one's wait, so it may
        # read the router's ids before its own (launch.late_dependents). The tiles stay after x's
        # preparation here: requested before it they took 95 -> 116 registers on sm_90 (10 -> 8
        # CTAs an SM: the 35B's 1,152 CTAs would no longer fit one wave)
        **pdl_kwargs(x.device, late=early() if early_down is None else early_down),
    )
    return h


def down(h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, routed: Matrix, shared: Matrix,
         hidden: int, num_experts: int, dtype: torch.dtype, cfg: PairConfig | None = None,
         fast: bool | None = None,
         add_norm: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor] | None = None,
         early_down: bool | None = None) -> torch.Tensor:
    """out [T, H] = sum_j weights[t, j] * D_e h_{t, j}, summed in slot order, rounded once.
    early_down (default: `early()`): launched early, right after a gate_up given the same value.

    add_norm = (residual [T, H], norm weight [H], eps, normed [T, H]): in the same launch, the
    last row chunk to finish adds out to the residual (rounded to its dtype) and writes the
    (1 + w) RMSNorm of the sum, as gemv_h2.launch's add_norm."""
    T, slots = ids.shape
    pairs = T * slots
    inner = h.shape[1]
    cfg = cfg or configs_for(hidden, inner, T)[1]
    _check(cfg, inner, hidden, "down")
    out = torch.empty(T, hidden, dtype=dtype, device=h.device)
    if pairs == 0:
        return out
    if add_norm is not None and T > PAIR_MAX:
        raise ValueError(f"pair down add_norm: at most {PAIR_MAX} tokens, got {T}")
    res, nw, eps, hout = H2.add_norm_args(add_norm, T, hidden, out, "pair down")
    n_slices = inner // (128 * cfg.kbs)
    chunks = hidden // cfg.rows
    ws = QK.Workspace.get(h.device)
    ws.ensure(*_workspace(pairs, hidden, n_slices, chunks + 1), QK.capturing(h))
    w, wh, wsc = _int_args(routed)
    sw, swh, sws = _int_args(shared)
    asm, constr = H2._asm(routed.fmt, 1)
    sasm, sconstr = H2._asm(shared.fmt, 1)
    _pair_down_kernel[(chunks, n_slices, pairs)](
        h, ids, weights, out, ws.partials, ws.counters,
        w, wh, wsc, sw, swh, sws, routed.gscale(), shared.gscale(), res, nw, hout,
        hidden, num_experts, slots, n_slices, pairs, T, chunks,
        h.stride(0), out.stride(0), w.stride(0), wh.stride(0), wsc.stride(0), sw.stride(0), swh.stride(0), sws.stride(0),
        res.stride(0), hout.stride(0), eps,
        FMT=routed.fmt, SFMT=shared.fmt, BLOCK_N=cfg.block_n, KBS=cfg.kbs, ROWS=cfg.rows,
        SLICES_P2=triton.next_power_of_2(n_slices), SLOTS_P2=triton.next_power_of_2(slots),
        HEAD=H2.HEAD[routed.fmt], SHEAD=H2.HEAD[shared.fmt],
        ASM=asm, CONSTR=constr, SASM=sasm, SCONSTR=sconstr, FAST=_fast(fast), ADD_NORM=add_norm is not None,
        EARLY=early() if early_down is None else early_down, TP=combine_width(T, routed.fmt, shared.fmt),
        num_warps=cfg.num_warps, **pdl_kwargs(h.device),
    )
    return out
