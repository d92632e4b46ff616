"""A decode MoE layer in one launch: router, top-k, the shared and routed experts' gate_up and
down, and the weighted combine (T <= 4 tokens on the pair kernels' formats).

Why: at one token the layer was three dependent launches (route_gemv, pair gate_up, pair down;
5.9 + 8.4 + 7.1 µs on the H200, BENCHMARKS.md "Fourth session") for ~19 MB that the copy
bandwidth moves in ~4.5 µs. Each launch pays its ramp and its tail, and the routed experts'
reads cannot start before the router's last program has picked them.

How: one grid of work items, every CTA taking the next item from a ticket counter (so an item is
only ever handed out after every lower item is already running, whatever order the hardware
dispatches CTAs in; items wait only on lower items, so the waits end):
1. router items: RB rows of [router; shared gate] . x each (fp32 logits to scratch); the last to
   arrive runs the top-k (router.py's `_top_k`) and releases a "routed" flag;
2. gate_up items (pair_gemv's `_gate_up_item`, unchanged): the shared expert's pairs first (they
   need no routing, so they stream while the router works), then the routed pairs, which acquire
   the flag and read their expert id; a chunk's last K slice writes h and counts the chunk into
   the pair's "h ready" counter;
3. down items (`_down_item`): pair by pair in the same order, each acquiring its pair's counter
   (all of h written); a row chunk's last arriver over every pair and slice combines, as the
   pair down kernel does.
The last row chunk to combine puts the counters back to zero for the next launch. Bits equal the
three launches' (same partials, same summation orders) where the router's dot sums in the same
order (the interpreter; compiled, a router logit can differ in its last fp32 bit) and at one
token (at 2-4, pair down combines every token in one load, `combine_width`, the block a token at
a time: compiled, their sums may differ in order).

The waits are ninfer.kernels.triton.sync's (relaxed polls with a short sleep, one acquire, a trap
rather than a hang). The scratch is one per (device, shapes): launches must run one
at a time on one stream (the engine's), as every decode kernel here assumes.

Off (`NINFER_MOE_BLOCK=1` turns it on for one-token decode): it is correct on the GPU (bit-equal
to the three launches, tests pass) but slower (BENCHMARKS.md, seventeenth run, H100: 27.7 µs a
layer against 23.0, the 35B step +0.39 ms). Its trace shows why: the phases cannot overlap (each
down item needs its pair's whole gate_up, each routed gate_up the routing), and inside one grid
each runs slower than as its own launch (parked CTAs share the SMs, the router's few items leave
most of them idle). Kept as the tested base for fusions whose phases do overlap.
"""

from __future__ import annotations

import os

import torch

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl
from ninfer.kernels.triton.launch import lasting, pdl_kwargs, pdl_prologue
from ninfer.kernels.triton.sync import wait_at_least
from ninfer_plugins.moe_triton import pair_gemv as PG
from ninfer_plugins.moe_triton.grouped_gemv import Matrix
from ninfer_plugins.moe_triton.router import _add_norm_row, _router_input, _top_k, _top_k_keys
from ninfer_plugins.quant_int import gemv_h2 as H2

# a router item holds a whole hidden row per token in registers: past this the kernel's register
# count (every item type's occupancy) grows (189 at 7,168 against 128 at 2,048)
MAX_HIDDEN = 4096
# router rows an item (4 rows of 2,048 bf16: 16 KB a CTA, 65 items for 256 experts + shared gate)
ROUTER_ROWS = 4
# counters: [ticket, router arrivals, routed flag, down chunks combined, normed x written,
# h ready per pair...]
# Each counter on its own 128-byte line (32 int32): the ticket, the arrivals and the releases are
# not queued at one L2 slice behind the CTAs polling a flag.
_LINE: tl.constexpr = tl.constexpr(32)
_TICKET: tl.constexpr = tl.constexpr(0)
_ROUTER: tl.constexpr = tl.constexpr(32)
_ROUTED: tl.constexpr = tl.constexpr(64)
_DONE: tl.constexpr = tl.constexpr(96)
_X_READY: tl.constexpr = tl.constexpr(128)
_H_READY: tl.constexpr = tl.constexpr(160)  # + pair * _LINE


def enabled() -> bool:
    return os.environ.get("NINFER_MOE_BLOCK", "0") == "1"


def max_tokens() -> int:
    """The most tokens a model call sends to the block (NINFER_MOE_BLOCK_MAX_T, 1..4; default 1:
    plain decode). Past one token the router's linear and `route` served so far (route_gemv lost
    at 4 tokens), so the verify of a speculative round keeps them unless this says otherwise."""
    try:
        n = int(os.environ.get("NINFER_MOE_BLOCK_MAX_T", "1"))
    except ValueError:
        n = 1
    return max(1, min(PG.PAIR_MAX, n))


def folds_norm() -> bool:
    """The block also takes the layer's post-mixer residual add and norm (NINFER_MOE_BLOCK_NORM=1,
    with NINFER_MOE_BLOCK=1)."""
    return enabled() and os.environ.get("NINFER_MOE_BLOCK_NORM", "0") == "1"


@triton.jit
def _now(ASM: tl.constexpr):
    """The GPU's global nanosecond timer (a trace's clock); 0 under the interpreter."""
    if ASM:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        t = tl.full([], 0, tl.int64)
    return t


@triton.jit
def _pair_of(q, T, TOP_K: tl.constexpr, SLOTS: tl.constexpr):
    """Ordinal q of the pairs in item order -> (pair id, is the shared expert's): the T shared
    pairs first, then token by token the routed ones."""
    qq = q - T
    p = tl.where(q < T, q * SLOTS + TOP_K, (qq // TOP_K) * SLOTS + qq % TOP_K)
    return p, q < T


@triton.jit
def _router_item(X, RW, SG_W, LWS, CNT, IDS, WEIGHTS, RES, NW, XN, item, T, E, H, N_R, sx, srw, sres, sxn, eps,
                 TOP_K: tl.constexpr, SLOTS: tl.constexpr, RB: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, LSTRIDE: tl.constexpr,
                 ADD_NORM: tl.constexpr, TOPK_KEYS: tl.constexpr):
    """Rows item * RB .. + RB of [router; shared gate] . x for every token into LWS, as
    route_gemv's programs compute them; the last item to arrive routes. Returns whether this
    CTA routed.

    ADD_NORM: X is the mixer's output d and x = (1 + w) RMSNorm(RES + d), which every router item
    computes for itself (4 KB rows from the L2), as route_gemv's programs do. Item 0 first writes
    x to XN (what the experts read) and releases it; the routing item, after every router item
    has read RES, writes RES + d back to RES."""
    h = tl.arange(0, BLOCK_H)
    h_ok = h < H
    if ADD_NORM:
        if item == 0:
            # first thing: the shared expert's gate_up items wait for this x
            for tt in tl.static_range(BLOCK_T):
                t_in = h_ok & ((h * 0 + tt) < T)
                _, xn = _add_norm_row(X, RES, NW, tt, sx, sres, h, t_in, H, eps)
                tl.store(XN + tt * sxn + h, xn, mask=t_in)
            tl.debug_barrier()
            tl.atomic_xchg(CNT + _X_READY, 1, sem="release")
    for tt in tl.static_range(BLOCK_T):
        xt = _router_input(X, RES, NW, tt, sx, sres, h, h_ok, T, H, eps, ADD_NORM)
        for i in tl.static_range(RB):
            r = item * RB + i
            wp = tl.where(r < E, RW + r.to(tl.int64) * srw, SG_W)
            # (masks are built as blocks: the interpreter types a block & scalar of int1 as int32)
            w = tl.load(wp + h, mask=h_ok & ((h * 0 + r) <= E), other=0.0).to(tl.float32)
            lg = tl.sum(w * xt, 0)
            # a router logit is rounded to the activations' dtype (the shared gate's stays fp32)
            lg = tl.where(r < E, lg.to(X.dtype.element_ty).to(tl.float32), lg)
            tl.store(LWS + tt * LSTRIDE + r, lg, mask=r <= tl.where(tt < T, E, -1))
    tl.debug_barrier()
    arrived = tl.atomic_add(CNT + _ROUTER, 1, sem="acq_rel")
    routes = arrived == N_R - 1
    if routes:
        t = tl.arange(0, BLOCK_T)
        t_ok = t < T
        e = tl.arange(0, BLOCK_E)
        e_ok = e < E
        logit = tl.load(LWS + t[:, None] * LSTRIDE + e[None, :], mask=t_ok[:, None] & e_ok[None, :], other=0.0,
                        cache_modifier=".cg")
        logit = tl.where(e_ok[None, :], logit, float("-inf"))
        if TOPK_KEYS:
            _top_k_keys(logit, t, t_ok, t.to(tl.int64), e, E, IDS, WEIGHTS, LWS + E, LSTRIDE,
                        TOP_K, SLOTS, BLOCK_T, BLOCK_E)
        else:
            _top_k(logit, t, t_ok, t.to(tl.int64), e, e_ok, LWS + E, IDS, WEIGHTS, E, LSTRIDE,
                   TOP_K, SLOTS, 2, BLOCK_T, BLOCK_E)
        if ADD_NORM:
            for tt in tl.static_range(BLOCK_T):
                t_in = h_ok & ((h * 0 + tt) < T)
                s_row, _ = _add_norm_row(X, RES, NW, tt, sx, sres, h, t_in, H, eps)
                tl.store(RES + tt * sres + h, s_row, mask=t_in)
        tl.atomic_xchg(CNT + _ROUTER, 0)
    return routes


@triton.jit(do_not_specialize=["T", "N_R", "GU_CHUNKS", "GU_SLICES", "DN_CHUNKS", "DN_SLICES"])
def _moe_block_kernel(
    X, RW, SG_W, LWS, IDS, WEIGHTS, HB, OUT, WSG, WSD, CNT, GCNT, DCNT, RES, NW, XN, TR,
    W, WH, WS_, GW, GWH, GWS, UW, UWH, UWS, WG, GWG, UWG,
    DW, DWH, DWS, SDW, SDWH, SDWS, DWG, SDWG,
    T, E, HID, INNER, N_R, GU_CHUNKS, GU_SLICES, DN_CHUNKS, DN_SLICES,
    sx, srw, shb, so, sw, swh, sws, sgw, sgwh, sgws, sdw, sdwh, sdws, ssdw, ssdwh, ssdws, sres, sxn, eps,
    TOP_K: tl.constexpr, SLOTS: tl.constexpr, RB: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, LSTRIDE: tl.constexpr,
    FMT: tl.constexpr, SFMT: tl.constexpr, GBN: tl.constexpr, GKBS: tl.constexpr, GROWS: tl.constexpr,
    GSP2: tl.constexpr, HEAD: tl.constexpr, SHEAD: tl.constexpr,
    ASM: tl.constexpr, CONSTR: tl.constexpr, SASM: tl.constexpr, SCONSTR: tl.constexpr,
    DFMT: tl.constexpr, DSFMT: tl.constexpr, DBN: tl.constexpr, DKBS: tl.constexpr, DROWS: tl.constexpr,
    DSP2: tl.constexpr, SLOTS_P2: tl.constexpr, DHEAD: tl.constexpr, DSHEAD: tl.constexpr,
    DASM: tl.constexpr, DCONSTR: tl.constexpr, DSASM: tl.constexpr, DSCONSTR: tl.constexpr,
    FAST: tl.constexpr, PAIRS_P2: tl.constexpr, ADD_NORM: tl.constexpr = False, TOPK_KEYS: tl.constexpr = False,
    TRACE: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    # the ticket: items are handed out in the order CTAs start, never ahead of a lower item
    item = tl.atomic_add(CNT + _TICKET, 1, sem="relaxed")
    if TRACE:
        t_start = _now(FAST)
        t_go = t_start
    pairs = T * SLOTS
    n_gu = pairs * GU_CHUNKS * GU_SLICES
    # what the experts read: x, or with ADD_NORM the normed sum that router item 0 writes
    if ADD_NORM:
        XE = XN
        sxe = sxn
    else:
        XE = X
        sxe = sx
    if item < N_R:
        routes = _router_item(X, RW, SG_W, LWS, CNT, IDS, WEIGHTS, RES, NW, XN, item, T, E, HID, N_R, sx, srw,
                              sres, sxn, eps, TOP_K, SLOTS, RB, BLOCK_T, BLOCK_E, BLOCK_H, LSTRIDE, ADD_NORM,
                              TOPK_KEYS)
        if routes:
            tl.debug_barrier()
            tl.atomic_xchg(CNT + _ROUTED, 1, sem="release")
    elif item < N_R + n_gu:
        g = item - N_R
        per = GU_CHUNKS * GU_SLICES
        p, shared = _pair_of(g // per, T, TOP_K, SLOTS)
        rem = g % per
        if shared:
            if ADD_NORM:
                wait_at_least(CNT + _X_READY, 1, FAST)
                if TRACE:
                    t_go = _now(FAST)
            e = E
        else:
            # (the routing item acquired every router item's arrival, item 0's x included)
            wait_at_least(CNT + _ROUTED, 1, FAST)
            if TRACE:
                t_go = _now(FAST)
            e = tl.load(IDS + p, cache_modifier=".cg")
        last = PG._gate_up_item(XE, HB, WSG, GCNT, p, e, rem // GU_SLICES, rem % GU_SLICES,
                                W, WH, WS_, GW, GWH, GWS, UW, UWH, UWS, WG, GWG, UWG,
                                INNER, E, SLOTS, GU_SLICES, GU_CHUNKS, sxe, shb, sw, swh, sws, sgw, sgwh, sgws,
                                FMT, SFMT, GBN, GKBS, GROWS, GSP2, HEAD, SHEAD, ASM, CONSTR, SASM, SCONSTR, FAST)
        if last:
            tl.debug_barrier()
            tl.atomic_add(CNT + _H_READY + p * _LINE, 1, sem="release")
    else:
        d = item - N_R - n_gu
        per = DN_CHUNKS * DN_SLICES
        p, shared = _pair_of(d // per, T, TOP_K, SLOTS)
        rem = d % per
        wait_at_least(CNT + _H_READY + p * _LINE, GU_CHUNKS, FAST)
        if TRACE:
            t_go = _now(FAST)
        if shared:
            e = E
        else:
            e = tl.load(IDS + p, cache_modifier=".cg")
        combined = PG._down_item(HB, IDS, WEIGHTS, OUT, WSD, DCNT, p, e, rem // DN_SLICES, rem % DN_SLICES,
                      DW, DWH, DWS, SDW, SDWH, SDWS, DWG, SDWG, OUT, SDWG, OUT,
                      HID, E, SLOTS, DN_SLICES, pairs, T, DN_CHUNKS,
                      shb, so, sdw, sdwh, sdws, ssdw, ssdwh, ssdws, 0, 0, 0.0,
                      DFMT, DSFMT, DBN, DKBS, DROWS, DSP2, SLOTS_P2, DHEAD, DSHEAD, DASM, DCONSTR, DSASM, DSCONSTR,
                      FAST, False, True, False, False)
        if combined:
            # the last row chunk combined: every item was handed out, every router and gate_up
            # CTA is past its last use of the counters and every down CTA past its wait, so the
            # counters go back to zero for the next launch (one atomic a chunk, not one a CTA)
            tl.debug_barrier()
            done = tl.atomic_add(CNT + _DONE, 1, sem="acq_rel")
            if done == DN_CHUNKS - 1:
                c = tl.arange(0, PAIRS_P2)
                tl.store(CNT + _H_READY + c * _LINE, tl.zeros([PAIRS_P2], tl.int32), mask=c < pairs)
                tl.atomic_xchg(CNT + _ROUTED, 0)
                tl.atomic_xchg(CNT + _X_READY, 0)
                tl.atomic_xchg(CNT + _TICKET, 0)
                tl.atomic_xchg(CNT + _DONE, 0)
    if TRACE:
        # [item, start, end of its wait (= start where it waited for nothing), end] in ns
        c4 = tl.arange(0, 4)
        t_end = _now(FAST)
        row = tl.where(c4 == 0, item.to(tl.int64), tl.where(c4 == 1, t_start, tl.where(c4 == 2, t_go, t_end)))
        tl.store(TR + item.to(tl.int64) * 4 + c4, row)


# --- host side --------------------------------------------------------------------------------------


def _geometry(hidden: int, inner: int) -> tuple[PG.PairConfig, PG.PairConfig, int]:
    cfgs = PG.configs_for(hidden, inner)
    if cfgs is None:
        raise ValueError(f"the fused MoE block does not fit hidden {hidden}, inner {inner}")
    gu, dn = cfgs
    return gu, dn, max(gu.num_warps, dn.num_warps)


def _splits(hidden: int, inner: int, gu: PG.PairConfig, dn: PG.PairConfig) -> tuple[int, int, int, int]:
    """(gate_up K slices, gate_up row chunks, down K slices, down row chunks) a pair."""
    return hidden // (128 * gu.kbs), inner // gu.rows, inner // (128 * dn.kbs), hidden // dn.rows


def supports(routed_gu: Matrix, routed_dn: Matrix, shared: tuple[Matrix, Matrix, Matrix] | None,
             hidden: int, inner: int, shared_inner: int) -> bool:
    """Where the pair kernels run, with one warp count for both halves."""
    if not PG.supports(routed_gu, routed_dn, shared, hidden, inner, shared_inner) or hidden > MAX_HIDDEN:
        return False
    gu, dn, warps = _geometry(hidden, inner)
    gu = PG.PairConfig(gu.block_n, gu.kbs, gu.rows, warps)
    dn = PG.PairConfig(dn.block_n, dn.kbs, dn.rows, warps)
    sg, _, sd = shared
    return (PG._fits(routed_gu, hidden, inner, gu) and PG._fits(sg, hidden, inner, gu)
            and PG._fits(routed_dn, inner, hidden, dn) and PG._fits(sd, inner, hidden, dn))


def scratch(device: torch.device, dtype: torch.dtype, num_experts: int, slots: int, hidden: int,
            inner: int) -> dict[str, torch.Tensor]:
    """The block's scratch for up to PAIR_MAX tokens, kept for the process (graphs hold the
    pointers; counters start at zero and the kernel puts them back). Ask for it outside any
    capture first (TritonMoe does at its first eager call)."""
    gu, dn, _ = _geometry(hidden, inner)
    gu_slices, gu_chunks, dn_slices, dn_chunks = _splits(hidden, inner, gu, dn)
    pairs = PG.PAIR_MAX * slots

    def make() -> dict[str, torch.Tensor]:
        f32 = dict(dtype=torch.float32, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        return {
            "lws": torch.zeros(triton.next_power_of_2(PG.PAIR_MAX) * (num_experts + 1), **f32),
            "wsg": torch.zeros(pairs * 2 * inner * gu_slices * 4, **f32),
            "wsd": torch.zeros(pairs * hidden * dn_slices * 4, **f32),
            "cnt": torch.zeros(_H_READY.value + pairs * _LINE.value, **i32),
            "gcnt": torch.zeros(pairs * gu_chunks, **i32),
            "dcnt": torch.zeros(dn_chunks, **i32),
            "h": torch.zeros(pairs, inner, dtype=dtype, device=device),
        }

    return lasting("moe_block", device, (dtype, num_experts, slots, hidden, inner), make)


def moe_block(x: torch.Tensor, router: torch.Tensor, shared_gate_weight: torch.Tensor, top_k: int,
              routed_gu: Matrix, shared_gate: Matrix, shared_up: Matrix, routed_dn: Matrix, shared_dn: Matrix,
              inner: int, num_experts: int, fast: bool | None = None, rows_per_item: int = ROUTER_ROWS,
              add_norm: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor] | None = None,
              topk_keys: bool | None = None, trace: torch.Tensor | None = None,
              configs: tuple[PG.PairConfig, PG.PairConfig] | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole MoE layer for x [T, H] (T <= PAIR_MAX) in one launch -> (out [T, H] in x's
    dtype, ids [T, slots] int32, weights [T, slots] fp32): what route_gemv then pair_gemv's
    gate_up and down compute. router [E, H] and the shared gate [1, H] or [H] dense in x's dtype.

    add_norm = (residual [T, H], norm weight [H], eps, out [T, H]): x is the mixer's output and
    the layer's post-mixer step happens in the same launch, as route_gemv's add_norm: residual
    += x (rounded to its dtype), out = (1 + w) RMSNorm(residual), which is routed and which the
    experts take.

    topk_keys (default: NINFER_MOE_BLOCK_TOPK=keys): the routing item picks with router.py's
    _top_k_keys (10 reductions on the critical path instead of 18; weights equal to a few ulps).

    trace: int64 [>= items, 4] (items: `item_count`): each item's row [item, start, end of its
    wait, end], from the GPU's nanosecond timer (zeros under the interpreter): where the block's
    time goes (`summarize_trace`). A measurement aid: the clock reads cost a little.

    configs: (gate_up, down) PairConfigs in place of pair_gemv's (tuned for two launches of their
    own); no more K slices or row chunks than those (the scratch is sized for them)."""
    T, hidden = x.shape
    if topk_keys is None:
        topk_keys = os.environ.get("NINFER_MOE_BLOCK_TOPK", "") == "keys"
    E = num_experts
    if not 0 < T <= PG.PAIR_MAX:
        raise ValueError(f"the fused MoE block serves 1..{PG.PAIR_MAX} tokens, got {T}")
    if not 1 <= rows_per_item <= 16:
        raise ValueError(f"the fused MoE block takes 1..16 router rows an item, got {rows_per_item}")
    if router.shape != (E, hidden) or router.stride(-1) != 1 or x.stride(-1) != 1:
        raise ValueError(f"the fused MoE block needs a dense router [{E}, {hidden}] and x with unit last strides")
    sgw = shared_gate_weight.reshape(-1)
    if sgw.numel() != hidden or router.dtype != x.dtype or sgw.dtype != x.dtype:
        raise ValueError("the fused MoE block's router and shared gate must be dense rows in x's dtype")
    res, nw, eps, xn = H2.add_norm_args(add_norm, T, hidden, x, "moe_block")
    if add_norm is not None and xn.dtype != x.dtype:
        raise ValueError(f"moe_block add_norm: out must be x's dtype ({xn.dtype}, {x.dtype})")
    slots = top_k + 1
    gu, dn, warps = _geometry(hidden, inner)
    if configs is not None:
        cgu, cdn = configs
        warps = max(cgu.num_warps, cdn.num_warps)
        fit = (PG.PairConfig(cgu.block_n, cgu.kbs, cgu.rows, warps), PG.PairConfig(cdn.block_n, cdn.kbs, cdn.rows, warps))
        if not (PG._fits(routed_gu, hidden, inner, fit[0]) and PG._fits(shared_gate, hidden, inner, fit[0])
                and PG._fits(routed_dn, inner, hidden, fit[1]) and PG._fits(shared_dn, inner, hidden, fit[1])
                and cgu.kbs >= gu.kbs and cgu.rows >= gu.rows and cdn.kbs >= dn.kbs and cdn.rows >= dn.rows):
            raise ValueError(f"moe_block configs {cgu.describe()} / {cdn.describe()} do not fit these weights "
                             f"or need more scratch than {gu.describe()} / {dn.describe()}")
        gu, dn = cgu, cdn
    sc = scratch(x.device, x.dtype, E, slots, hidden, inner)
    ids = torch.empty(T, slots, dtype=torch.int32, device=x.device)
    weights = torch.empty(T, slots, dtype=torch.float32, device=x.device)
    out = torch.empty(T, hidden, dtype=x.dtype, device=x.device)
    fast = PG._fast(fast)
    w, wh, wsc = PG._int_args(routed_gu)
    gw, gwh, gws = PG._int_args(shared_gate)
    uw, uwh, uws = PG._int_args(shared_up)
    if (gw.stride(0), gwh.stride(0), gws.stride(0)) != (uw.stride(0), uwh.stride(0), uws.stride(0)):
        raise ValueError("the shared expert's gate and up weights must share their row strides")
    dw, dwh, dws = PG._int_args(routed_dn)
    sdw, sdwh, sdws = PG._int_args(shared_dn)
    asm, constr = H2._asm(routed_gu.fmt, 1)
    sasm, sconstr = H2._asm(shared_gate.fmt, 1)
    dasm, dconstr = H2._asm(routed_dn.fmt, 1)
    dsasm, dsconstr = H2._asm(shared_dn.fmt, 1)
    gu_slices, gu_chunks, dn_slices, dn_chunks = _splits(hidden, inner, gu, dn)
    n_r = triton.cdiv(E + 1, rows_per_item)
    pairs = T * slots
    grid = n_r + pairs * (gu_chunks * gu_slices + dn_chunks * dn_slices)
    h = sc["h"]
    if trace is not None and (trace.dtype != torch.int64 or trace.dim() != 2 or trace.shape[0] < grid
                              or trace.shape[1] != 4 or not trace.is_contiguous()):
        raise ValueError(f"moe_block trace: a contiguous int64 [>= {grid}, 4] tensor, got {tuple(trace.shape)} {trace.dtype}")
    _moe_block_kernel[(grid,)](
        x, router, sgw, sc["lws"], ids, weights, h, out, sc["wsg"], sc["wsd"], sc["cnt"], sc["gcnt"], sc["dcnt"],
        res, nw, xn, trace if trace is not None else sc["cnt"],
        w, wh, wsc, gw, gwh, gws, uw, uwh, uws, routed_gu.gscale(), shared_gate.gscale(), shared_up.gscale(),
        dw, dwh, dws, sdw, sdwh, sdws, routed_dn.gscale(), shared_dn.gscale(),
        T, E, hidden, inner, n_r, gu_chunks, gu_slices, dn_chunks, dn_slices,
        x.stride(0), router.stride(0), h.stride(0), out.stride(0),
        w.stride(0), wh.stride(0), wsc.stride(0), gw.stride(0), gwh.stride(0), gws.stride(0),
        dw.stride(0), dwh.stride(0), dws.stride(0), sdw.stride(0), sdwh.stride(0), sdws.stride(0),
        res.stride(0), xn.stride(0), eps,
        TOP_K=top_k, SLOTS=slots, RB=rows_per_item,
        BLOCK_T=triton.next_power_of_2(T), BLOCK_E=triton.next_power_of_2(E), BLOCK_H=triton.next_power_of_2(hidden),
        LSTRIDE=E + 1,
        FMT=routed_gu.fmt, SFMT=shared_gate.fmt, GBN=gu.block_n, GKBS=gu.kbs, GROWS=gu.rows,
        GSP2=triton.next_power_of_2(gu_slices), HEAD=H2.HEAD[routed_gu.fmt], SHEAD=H2.HEAD[shared_gate.fmt],
        ASM=asm, CONSTR=constr, SASM=sasm, SCONSTR=sconstr,
        DFMT=routed_dn.fmt, DSFMT=shared_dn.fmt, DBN=dn.block_n, DKBS=dn.kbs, DROWS=dn.rows,
        DSP2=triton.next_power_of_2(dn_slices), SLOTS_P2=triton.next_power_of_2(slots),
        DHEAD=H2.HEAD[routed_dn.fmt], DSHEAD=H2.HEAD[shared_dn.fmt],
        DASM=dasm, DCONSTR=dconstr, DSASM=dsasm, DSCONSTR=dsconstr,
        FAST=fast, PAIRS_P2=triton.next_power_of_2(pairs), ADD_NORM=add_norm is not None, TOPK_KEYS=bool(topk_keys),
        TRACE=trace is not None, num_warps=warps,
        **pdl_kwargs(x.device),
    )
    return out, ids, weights


def item_count(T: int, top_k: int, hidden: int, inner: int, num_experts: int, rows_per_item: int = ROUTER_ROWS) -> tuple[int, ...]:
    """(router items, gate_up items, down items) of one launch, in ticket order."""
    gu, dn, _ = _geometry(hidden, inner)
    gu_slices, gu_chunks, dn_slices, dn_chunks = _splits(hidden, inner, gu, dn)
    pairs = T * (top_k + 1)
    return triton.cdiv(num_experts + 1, rows_per_item), pairs * gu_chunks * gu_slices, pairs * dn_chunks * dn_slices


def summarize_trace(trace: torch.Tensor, counts: tuple[int, ...], T: int, top_k: int) -> dict[str, float]:
    """µs from the first item's start: when each phase's items started, got past their waits and
    ended (the router's last end is the routing's; gate_up and down split into the shared
    expert's items, which come first, and the routed ones)."""
    n_r, n_gu, n_dn = counts
    n = n_r + n_gu + n_dn
    tr = trace[:n].cpu().double()
    us = (tr - tr[:, 1].min()) / 1e3
    gu_shared = n_gu // (T * (top_k + 1)) * T
    dn_shared = n_dn // (T * (top_k + 1)) * T
    spans = {
        "router": (0, n_r),
        "gate_up shared": (n_r, n_r + gu_shared),
        "gate_up routed": (n_r + gu_shared, n_r + n_gu),
        "down shared": (n_r + n_gu, n_r + n_gu + dn_shared),
        "down routed": (n_r + n_gu + dn_shared, n),
    }
    out: dict[str, float] = {}
    for name, (a, b) in spans.items():
        rows = us[a:b]
        if rows.shape[0] == 0:
            continue
        out[f"{name}: first start"] = float(rows[:, 1].min())
        out[f"{name}: median past its wait"] = float(rows[:, 2].median())
        out[f"{name}: last past its wait"] = float(rows[:, 2].max())
        out[f"{name}: last end"] = float(rows[:, 3].max())
    out["kernel: last end"] = float(us[:, 3].max())
    return out
