"""The router of a sparse-MoE layer in one launch: logits -> fp32 softmax over every expert ->
top-k -> renormalise (spec 2.5), the shared expert's sigmoid gate beside it, and for decode the
tile plan the grouped kernels run from. Expert ids never leave the GPU.

Pairs and slots. Token t owns `slots` consecutive pairs p = t * slots + j: j < top_k is its j-th
routed expert (descending probability), j = top_k (when the layer has a shared expert) is the
shared expert, given the id `num_experts` so the grouped kernels treat it as one more expert.
`ids` and `weights` are [T, slots]; a shared pair's weight is sigmoid(shared_expert_gate . x).

The tile plan. A tile is one expert and up to `block_m` of its pairs: `tile_expert` [n_tiles]
int32 (-1 for an empty tile, whose programs exit at once) and `tile_rows` [n_tiles, block_m]
int32 pair ids (-1 padding). Experts come in ascending order, pairs ascending within an expert,
so the plan is unique and the fused plan below must equal `grouped_gemm.plan_tiles` bit for bit.
`n_tiles` depends on shapes only (`max_tiles`): the grids of a decode step are fixed, which is
what lets a CUDA graph replay it for any routing.

Decode (T <= block_m, at most 16): one program holds every token's probabilities ([T, E] is
16 x 256 floats at most), so it also builds the plan: an expert gets one tile (a token picks an
expert at most once, so an expert has at most T <= block_m pairs), tiles numbered by a prefix sum
over the experts in use, rows by a prefix sum over tokens. Prefill routes a block of tokens per
program and plans with torch ops (grouped_gemm.plan_tiles).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl
from ninfer.kernels.triton import sync as SY
from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue
from ninfer_plugins.quant_int.gemv_h2 import add_norm_args

# Shared-gate modes of the kernel: no shared expert; its gate as a dot with a dense weight row
# (one launch fewer); its gate logit computed beforehand (a quantized gate weight).
NO_SHARED, SHARED_DOT, SHARED_LOGIT = 0, 1, 2
# A token picks an expert once, so below this many tokens every expert fits one decode tile.
DECODE_BLOCK_M = 16


@dataclass
class Routing:
    """What the grouped kernels read: see the module doc. Tensors on the activations' device."""

    ids: torch.Tensor  # int32 [T, slots]
    weights: torch.Tensor  # fp32 [T, slots]
    top_k: int
    slots: int
    tile_expert: torch.Tensor | None = None  # int32 [n_tiles]
    tile_rows: torch.Tensor | None = None  # int32 [n_tiles, block_m]
    block_m: int = 0

    @property
    def num_tokens(self) -> int:
        return self.ids.shape[0]

    @property
    def n_tiles(self) -> int:
        return 0 if self.tile_expert is None else self.tile_expert.shape[0]


def max_tiles(num_tokens: int, top_k: int, num_experts: int, block_m: int, shared: bool) -> int:
    """An upper bound on the tiles of any routing, from shapes alone.

    Routed pairs P = T * top_k over U <= min(E, P) experts in use: sum ceil(c_e / BM) <=
    P / BM + U. When T <= BM every expert in use has at most T <= BM pairs: exactly U tiles.
    """
    pairs = num_tokens * top_k
    used = min(num_experts, pairs)
    routed = used if num_tokens <= block_m else -(-pairs // block_m) + used
    return routed + (-(-num_tokens // block_m) if shared else 0)


# the token count and the tile count vary per call: one compiled variant serves them all
@triton.jit
def _top_k(logit, t, t_ok, t64, e, e_ok, SG_LOGIT, IDS, WEIGHTS, E, stride_sg,
           TOP_K: tl.constexpr, SLOTS: tl.constexpr, SHARED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """Softmax, top-k, renormalise and the shared pair, from fp32 logits [BLOCK_T, BLOCK_E]
    (-inf past E); stores ids / weights and returns (sel, kth) for the plan."""
    p = tl.exp(logit - tl.max(logit, 1)[:, None])
    p = p / tl.sum(p, 1)[:, None]

    # top-k by repeated max; a tie goes to the lower expert id
    left = tl.where(e_ok[None, :], p, -1.0)
    sel = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.int32)
    kth = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(left, 1)
        idx = tl.min(tl.where(left == best[:, None], e[None, :], BLOCK_E), 1)
        idx = tl.minimum(idx, E - 1)  # NaN logits match nothing: stay in bounds (the output is NaN)
        hit = (e[None, :] == idx[:, None]) & t_ok[:, None]
        sel = tl.where(hit, 1, sel)
        kth = tl.where(hit, k, kth)
        left = tl.where(hit, -1.0, left)
        tl.store(IDS + t64 * SLOTS + k, idx, mask=t_ok)
    chosen = sel > 0
    total = tl.sum(tl.where(chosen, p, 0.0), 1)
    total = tl.where(total > 0, total, 1.0)  # rows past T chose nothing
    tl.store(WEIGHTS + t64[:, None] * SLOTS + kth, p / total[:, None], mask=chosen)

    # (SHARED 1, the gate as a dot: the route kernel takes it ahead of its logits' load)
    tl.static_assert(SHARED != 1, "_top_k takes the shared gate as a logit (2) or none (0)")
    if SHARED == 2:
        g = tl.load(SG_LOGIT + t64 * stride_sg, mask=t_ok, other=0.0).to(tl.float32)
        tl.store(WEIGHTS + t64 * SLOTS + TOP_K, tl.sigmoid(g), mask=t_ok)
        tl.store(IDS + t64 * SLOTS + TOP_K, t * 0 + E, mask=t_ok)
    return sel, kth


@triton.jit
def _top_k_keys(logit, t, t_ok, t64, e, E, IDS, WEIGHTS, SG_LOGIT, stride_sg,
                TOP_K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """_top_k's routing (shared gate from SG_LOGIT, as SHARED = 2) in fewer reductions: one max a
    pick over int64 keys (the logit's order-preserving bits above, BLOCK_E - 1 - expert below:
    the largest logit, the lowest expert among equal ones), then the chosen logits' softmax
    (the full softmax's denominator cancels in the renormalisation): TOP_K + 2 reductions
    against _top_k's 2 * TOP_K + 2. The weights may differ from _top_k's in their last bits, and
    two logits that differ by less than exp's rounding may be ordered differently."""
    bits = logit.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (BLOCK_E - 1 - e)[None, :].to(tl.int64)
    sel = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.int32)
    kth = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.int32)
    floor = tl.full((BLOCK_T, BLOCK_E), -9223372036854775807 - 1, tl.int64)
    for k in tl.static_range(TOP_K):
        best = tl.max(key, 1)
        idx = BLOCK_E - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        idx = tl.minimum(idx, E - 1)
        hit = (e[None, :] == idx[:, None]) & t_ok[:, None]
        sel = tl.where(hit, 1, sel)
        kth = tl.where(hit, k, kth)
        key = tl.where(hit, floor, key)
        tl.store(IDS + t64 * SLOTS + k, idx, mask=t_ok)
    chosen = sel > 0
    top = tl.max(tl.where(chosen, logit, float("-inf")), 1)
    top = tl.where(top == float("-inf"), 0.0, top)  # rows past T chose nothing
    ex = tl.where(chosen, tl.exp(logit - top[:, None]), 0.0)
    total = tl.sum(ex, 1)
    total = tl.where(total > 0, total, 1.0)
    tl.store(WEIGHTS + t64[:, None] * SLOTS + kth, ex / total[:, None], mask=chosen)
    g = tl.load(SG_LOGIT + t64 * stride_sg, mask=t_ok, other=0.0).to(tl.float32)
    tl.store(WEIGHTS + t64 * SLOTS + TOP_K, tl.sigmoid(g), mask=t_ok)
    tl.store(IDS + t64 * SLOTS + TOP_K, t * 0 + E, mask=t_ok)


@triton.jit(do_not_specialize=["T", "n_tiles"])
def _route_kernel(
    LOGITS, X, SG_W, SG_LOGIT, IDS, WEIGHTS, TILE_EXPERT, TILE_ROWS,
    T, E, H, stride_l, stride_x, stride_sg, n_tiles,
    TOP_K: tl.constexpr, SLOTS: tl.constexpr, SHARED: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    PLAN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_TILES: tl.constexpr, HC: tl.constexpr = 0,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    t64 = t.to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    e_ok = e < E
    if SHARED == 1:
        tl.static_assert(HC > 0, "the shared gate's dot needs HC = H")
        # the shared gate's dot (HC = H) first: its loads wait on nothing, and unrolled into one
        # [BLOCK_T, BLOCK_H] sum they are all in flight together, then one reduction (a runtime
        # loop over H waited an L2 round trip and reduced once per block: eight at the 35B's H)
        hh = tl.arange(0, BLOCK_H)
        sacc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        for h0 in tl.static_range(0, HC, BLOCK_H):
            h_ok = (h0 + hh) < HC
            xv = tl.load(X + t64[:, None] * stride_x + h0 + hh[None, :], mask=t_ok[:, None] & h_ok[None, :], other=0.0)
            sacc += xv.to(tl.float32) * tl.load(SG_W + h0 + hh, mask=h_ok, other=0.0).to(tl.float32)[None, :]
        sg_logit = tl.sum(sacc, 1)
    logit = tl.load(LOGITS + t64[:, None] * stride_l + e[None, :], mask=t_ok[:, None] & e_ok[None, :], other=0.0)
    logit = tl.where(e_ok[None, :], logit.to(tl.float32), float("-inf"))
    # _top_k's shared pair: none where it was taken above
    TK_SHARED: tl.constexpr = 0 if SHARED == 1 else SHARED
    sel, kth = _top_k(logit, t, t_ok, t64, e, e_ok, SG_LOGIT, IDS, WEIGHTS, E, stride_sg,
                      TOP_K, SLOTS, TK_SHARED, BLOCK_T, BLOCK_E)
    if SHARED == 1:
        tl.store(WEIGHTS + t64 * SLOTS + TOP_K, tl.sigmoid(sg_logit), mask=t_ok)
        tl.store(IDS + t64 * SLOTS + TOP_K, t * 0 + E, mask=t_ok)
    chosen = sel > 0

    if PLAN:
        # one program, BLOCK_T >= T: every token's choice is in `sel`
        used = tl.max(sel, 0)
        rank = tl.cumsum(used, 0) - used  # tile of each expert in use
        n_used = tl.sum(used, 0)
        row = tl.cumsum(sel, 0) - sel  # a token's row in its expert's tile
        HAS_SHARED: tl.constexpr = SLOTS - TOP_K
        j = tl.arange(0, BLOCK_TILES)
        r = tl.arange(0, BLOCK_M)
        tl.store(TILE_EXPERT + j, tl.full((BLOCK_TILES,), -1, tl.int32), mask=(j >= n_used + HAS_SHARED) & (j < n_tiles))
        tl.store(TILE_EXPERT + rank, e, mask=used > 0)
        tl.store(TILE_ROWS + j[:, None] * BLOCK_M + r[None, :], tl.full((BLOCK_TILES, BLOCK_M), -1, tl.int32),
                 mask=(j < n_tiles)[:, None])
        # the -1 fill above and the rows below may share addresses: order them across threads
        tl.debug_barrier()
        tl.store(TILE_ROWS + rank[None, :] * BLOCK_M + row, t[:, None] * SLOTS + kth, mask=chosen)
        if HAS_SHARED:
            tl.store(TILE_EXPERT + n_used, E)
            tl.store(TILE_ROWS + n_used * BLOCK_M + t, t * SLOTS + TOP_K, mask=t_ok)


def _empty_routing(T: int, E: int, top_k: int, shared: bool, dev: torch.device) -> Routing:
    """The ids / weights a routing kernel fills, [T, top_k (+1 for the shared pair)]."""
    if top_k > E:
        raise ValueError(f"top_k {top_k} is more than the {E} experts")
    slots = top_k + shared
    return Routing(torch.empty(T, slots, dtype=torch.int32, device=dev),
                   torch.empty(T, slots, dtype=torch.float32, device=dev), top_k, slots)


# --- decode: the router GEMV and the routing in one launch --------------------------------------------


@triton.jit
def _add_norm_row(D, RES, NW, tt, stride_d, stride_res, h, ok, H, eps):
    """Token tt's residual add and (1 + w) RMSNorm, as cuda_fast's add_rms_norm: s = res + d
    rounded to the residual's dtype, then norm(s) -> (s, normed row in D's dtype)."""
    d = tl.load(D + tt * stride_d + h, mask=ok, other=0.0).to(tl.float32)
    s = (d + tl.load(RES + tt * stride_res + h, mask=ok, other=0.0).to(tl.float32)).to(RES.dtype.element_ty)
    sf = s.to(tl.float32)
    nw = tl.load(NW + h, mask=ok, other=0.0).to(tl.float32) + 1.0
    return s, (sf * tl.rsqrt(tl.sum(sf * sf, 0) / H + eps) * nw).to(D.dtype.element_ty)


@triton.jit
def _router_input(X, RES, NW, tt, stride_x, stride_res, h, h_ok, T, H, eps, ADD_NORM: tl.constexpr):
    """Token tt's row as the router's dots take it, fp32: x's row, or with ADD_NORM the
    (1 + w) RMSNorm of RES + x (_add_norm_row); zeros past T."""
    t_in = h_ok & ((h * 0 + tt) < T)
    if ADD_NORM:
        _, xn = _add_norm_row(X, RES, NW, tt, stride_x, stride_res, h, t_in, H, eps)
        xt = xn.to(tl.float32)
    else:
        xt = tl.load(X + tt * stride_x + h, mask=t_in, other=0.0).to(tl.float32)
    return xt


@triton.jit(do_not_specialize=["T"])
def _route_gemv_kernel(
    X, RW, SG_W, LWS, CNT, IDS, WEIGHTS, RES, NW, HOUT,
    T, E, H, stride_x, stride_rw, stride_res, stride_hout, eps,
    TOP_K: tl.constexpr, SLOTS: tl.constexpr, SHARED: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, LSTRIDE: tl.constexpr,
    ADD_NORM: tl.constexpr = False, PDL: tl.constexpr = False, TOPK_KEYS: tl.constexpr = False,
):
    """Program r computes row r of [router; shared gate] . x for every token (one warp, the whole
    row in one load), into the fp32 scratch LWS [BLOCK_T, LSTRIDE]; the last program to finish
    routes from there (its reductions are shuffles of one warp).

    ADD_NORM: X is the mixer's output d, and x = (1 + w) RMSNorm(RES + d) is computed by every
    program (4 KB rows, read from the L2); the last program, after every other has read RES,
    writes RES + d back to RES and x to HOUT (what the experts read next).

    The row's weights depend on no kernel before: they are requested before the PDL wait, so
    they stream during the previous kernel's tail."""
    r = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    h_ok = h < H
    # (both loads in their own dtypes, one of them fully masked; converted after the wait, so the
    # loads stay in flight across it)
    routed = (h * 0 + r) < E
    wr = tl.load(RW + tl.minimum(r, E - 1).to(tl.int64) * stride_rw + h, mask=h_ok & routed, other=0.0)
    ws = tl.load(SG_W + h, mask=h_ok & (routed == 0), other=0.0)
    # KEEP (one token with the add + norm; T = 1, as route_gemv returns before launching at T = 0):
    # the row's sum and norm stay in registers for the last program's stores, instead of being
    # loaded and computed again after the routing (an L2 round trip in the launch's serial tail)
    KEEP: tl.constexpr = ADD_NORM and BLOCK_T == 1
    pdl_prologue(PDL)
    w = tl.where(routed, wr.to(tl.float32), ws.to(tl.float32))
    for tt in tl.static_range(BLOCK_T):
        if KEEP:
            s_row, xn = _add_norm_row(X, RES, NW, tt, stride_x, stride_res, h, h_ok, H, eps)
            xt = xn.to(tl.float32)
        else:
            xt = _router_input(X, RES, NW, tt, stride_x, stride_res, h, h_ok, T, H, eps, ADD_NORM)
        lg = tl.sum(w * xt, 0)
        # a router logit is rounded to the activations' dtype, as the router linear's output is
        # (the shared gate's stays fp32, as the route kernel's own dot)
        lg = tl.where(r < E, lg.to(X.dtype.element_ty).to(tl.float32), lg)
        tl.store(LWS + tt * LSTRIDE + r, lg, mask=(r * 0 + tt) < T)
    tl.debug_barrier()
    arrived = SY.arrive(CNT)
    if arrived == tl.num_programs(0) - 1:
        SY.acquire_all(arrived)
        t = tl.arange(0, BLOCK_T)
        t_ok = t < T
        t64 = t.to(tl.int64)
        e = tl.arange(0, BLOCK_E)
        e_ok = e < E
        logit = tl.load(LWS + t[:, None] * LSTRIDE + e[None, :], mask=t_ok[:, None] & e_ok[None, :], other=0.0,
                        cache_modifier=".cg")
        logit = tl.where(e_ok[None, :], logit, float("-inf"))
        if TOPK_KEYS:
            # one max a pick over (logit, expert) keys: TOP_K + 2 reductions of the one warp
            # instead of 2 TOP_K + 2 (with a shared gate only: it writes the shared slot)
            _top_k_keys(logit, t, t_ok, t64, e, E, IDS, WEIGHTS, LWS + E, LSTRIDE, TOP_K, SLOTS, BLOCK_T, BLOCK_E)
        else:
            _top_k(logit, t, t_ok, t64, e, e_ok, LWS + E, IDS, WEIGHTS, E, LSTRIDE, TOP_K, SLOTS, SHARED, BLOCK_T, BLOCK_E)
        if KEEP:
            tl.store(HOUT + h, xn, mask=h_ok)
            tl.store(RES + h, s_row, mask=h_ok)
        elif ADD_NORM:
            for tt in tl.static_range(BLOCK_T):
                t_in = h_ok & ((h * 0 + tt) < T)
                s_row, xn = _add_norm_row(X, RES, NW, tt, stride_x, stride_res, h, t_in, H, eps)
                tl.store(HOUT + tt * stride_hout + h, xn, mask=t_in)
                tl.store(RES + tt * stride_res + h, s_row, mask=t_in)
        SY.rearm(CNT)


# The fused router serves one token (plain decode). Measured on the H200 (bench/moe.py, 35B
# router 256 x 2048 bf16): T = 1 6.1 µs against 5.6 + 5.4 for the router linear then `route`;
# T = 4 16.8 µs against 5.9 + 6.3 (one warp a row does every token's dot and the top-k of four
# tokens alone), so a verify of 4 keeps the two launches. The kernel itself takes up to 4.
ROUTE_GEMV_MAX_T = 4
ROUTE_GEMV_FASTER_T = 1


def route_gemv_tokens() -> int:
    """The most tokens a pair-path call routes with route_gemv: ROUTE_GEMV_FASTER_T, or
    NINFER_ROUTE_GEMV_T (1..4, read at each call), an A/B switch for the verify's T = 4 in the
    model (one launch instead of the router linear then `route`; its one-warp top-k tail over
    [4, 256] is ~4x the static instructions of T = 1's, 6,448 against 1,600 on sm_90)."""
    v = os.environ.get("NINFER_ROUTE_GEMV_T", "").strip()
    if not v:
        return ROUTE_GEMV_FASTER_T
    if v not in ("1", "2", "3", "4"):
        raise ValueError(f"NINFER_ROUTE_GEMV_T={v!r}: give 1 to {ROUTE_GEMV_MAX_T} (tokens routed in one launch)")
    return int(v)


def _gemv_warps(T: int) -> int:
    """route_gemv's warps a program: one (a row's dot is one warp's shuffles, and so are the last
    program's top-k reductions), or past one token NINFER_ROUTE_GEMV_WARPS (1, 2 or 4; an A/B
    switch read at each call): more warps share the last program's [T, E] top-k, each
    reduction then crossing warps through shared memory."""
    v = os.environ.get("NINFER_ROUTE_GEMV_WARPS", "").strip() or "1"
    if v not in ("1", "2", "4"):
        raise ValueError(f"NINFER_ROUTE_GEMV_WARPS={v!r}: give 1, 2 or 4")
    return 1 if T == 1 else int(v)


def route_gemv(
    x: torch.Tensor,
    router: torch.Tensor,
    top_k: int,
    shared_gate_weight: torch.Tensor | None,
    scratch: tuple[torch.Tensor, torch.Tensor],
    add_norm: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor] | None = None,
    topk_keys: bool | None = None,
) -> Routing:
    """route(x @ router.T, top_k, x=x, shared_gate_weight=...) in one launch for T <= 4 tokens:
    x [T, H], router [E, H] and the shared gate [1, H] or [H] dense; `scratch` is (fp32 floats
    >= T * (E + 1), int32 counter that is 0 and is left 0), e.g. quant_int's Workspace.

    add_norm = (residual [T, H], norm weight [H], eps, out [T, H]): x is the mixer's output and
    the layer's post-mixer step happens in the same launch: residual += x (rounded to its dtype)
    and out = (1 + w) RMSNorm(residual), which is what is routed (and what the experts take).

    topk_keys (default: NINFER_ROUTE_TOPK=keys, an A/B switch read at each launch; with a shared
    gate only): the last program picks with _top_k_keys, 10 one-warp reductions on the launch's
    serial tail instead of 18; the weights agree to a few ulps, and two logits closer than exp's
    rounding may be ordered the other way."""
    T, H = x.shape
    res, nw, eps, hout = add_norm_args(add_norm, T, H, x, "route_gemv")
    if add_norm is not None and (hout.dtype != x.dtype or x.stride(1) != 1):
        raise ValueError(f"route_gemv add_norm: out must be x's dtype ({hout.dtype}, {x.dtype}) and x needs a unit last stride")
    E = router.shape[0]
    if T > ROUTE_GEMV_MAX_T:
        raise ValueError(f"the fused router serves at most {ROUTE_GEMV_MAX_T} tokens, got {T}")
    shared = shared_gate_weight is not None
    r = _empty_routing(T, E, top_k, shared, x.device)
    slots = r.slots
    if T == 0:
        return r
    lws, cnt = scratch
    block_t = triton.next_power_of_2(T)
    lstride = E + 1
    if lws.numel() < block_t * lstride or cnt.numel() < 1:
        raise ValueError("the fused router's scratch is too small")
    sg = shared_gate_weight.reshape(-1) if shared else router
    if topk_keys is None:
        topk_keys = os.environ.get("NINFER_ROUTE_TOPK") == "keys"
    _route_gemv_kernel[(E + shared,)](
        x, router, sg, lws, cnt, r.ids, r.weights, res, nw, hout,
        T, E, H, x.stride(0), router.stride(0), res.stride(0), hout.stride(0), eps,
        TOP_K=top_k, SLOTS=slots, SHARED=SHARED_LOGIT if shared else NO_SHARED,
        BLOCK_T=block_t, BLOCK_E=triton.next_power_of_2(E), BLOCK_H=triton.next_power_of_2(H), LSTRIDE=lstride,
        ADD_NORM=add_norm is not None, TOPK_KEYS=bool(topk_keys) and shared, num_warps=_gemv_warps(T),
        **pdl_kwargs(x.device),
    )
    return r


def route(
    logits: torch.Tensor,
    top_k: int,
    *,
    x: torch.Tensor | None = None,
    shared_gate_weight: torch.Tensor | None = None,
    shared_gate_logit: torch.Tensor | None = None,
    plan: bool = False,
) -> Routing:
    """Route T tokens: logits [T, E] (any float dtype) -> ids / weights [T, slots].

    With `x` [T, H] and `shared_gate_weight` ([1, H] or [H], dense) or `shared_gate_logit` [T] /
    [T, 1], each token also gets its shared-expert pair. `plan` (T <= 16) builds the decode tile
    plan in the same launch. The shared gate's dot runs ahead of the logits' load, unrolled over
    H with one reduction (the former block-by-block loop after the top-k was 0.04 ms slower a
    35B round: BENCHMARKS.md, twenty-sixth run).
    """
    T, E = logits.shape
    mode = NO_SHARED
    if shared_gate_weight is not None:
        if x is None:
            raise ValueError("the shared gate's dot needs x")
        mode = SHARED_DOT
    elif shared_gate_logit is not None:
        mode = SHARED_LOGIT
    r = _empty_routing(T, E, top_k, mode != NO_SHARED, logits.device)
    slots = r.slots
    dev = logits.device
    if T == 0:
        return r
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    xt = x if mode == SHARED_DOT else logits
    if xt.stride(-1) != 1:
        xt = xt.contiguous()
    sg_w = shared_gate_weight.reshape(-1) if mode == SHARED_DOT else logits
    sg_l = shared_gate_logit.reshape(T, -1) if mode == SHARED_LOGIT else logits
    block_e = triton.next_power_of_2(E)
    if plan:
        if T > DECODE_BLOCK_M:
            raise ValueError(f"the fused plan serves at most {DECODE_BLOCK_M} tokens, got {T}")
        n_tiles = max_tiles(T, top_k, E, DECODE_BLOCK_M, mode != NO_SHARED)
        r.tile_expert = torch.empty(n_tiles, dtype=torch.int32, device=dev)
        r.tile_rows = torch.empty(n_tiles, DECODE_BLOCK_M, dtype=torch.int32, device=dev)
        r.block_m = DECODE_BLOCK_M
        block_t, grid = triton.next_power_of_2(T), 1
    else:
        n_tiles = 0
        # 16 tokens x 256 experts of fp32 per program: a few tiles of registers for 4 warps
        block_t = max(1, min(16, 4096 // block_e, triton.next_power_of_2(T)))
        grid = triton.cdiv(T, block_t)
    # a decode token's 256 probabilities fit one warp: its top-k reductions are then shuffles,
    # no shared memory round trips (the one-program plan at T = 16 wants 8 warps)
    warps = max(1, min(8, (block_t * block_e) // 256))
    tile_expert = r.tile_expert if plan else r.ids
    tile_rows = r.tile_rows if plan else r.ids
    _route_kernel[(grid,)](
        logits, xt, sg_w, sg_l, r.ids, r.weights, tile_expert, tile_rows,
        T, E, xt.shape[-1], logits.stride(0), xt.stride(0), sg_l.stride(0), n_tiles,
        TOP_K=top_k, SLOTS=slots, SHARED=mode,
        BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_H=min(256, triton.next_power_of_2(xt.shape[-1])),
        PLAN=plan, BLOCK_M=DECODE_BLOCK_M, BLOCK_TILES=triton.next_power_of_2(max(n_tiles, 1)),
        HC=xt.shape[-1] if mode == SHARED_DOT else 0,
        num_warps=warps,
    )
    return r


# --- the torch oracle -------------------------------------------------------------------------------


def route_reference(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec 2.5 as written: softmax in fp32, top-k, divide by the sum of the top-k."""
    probs = torch.softmax(logits.float(), dim=-1)
    vals, ids = torch.topk(probs, top_k, dim=-1)
    return ids, vals / vals.sum(-1, keepdim=True)
