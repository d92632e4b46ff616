"""The grouped expert kernels: fused gate/up + SiLU * up, then down times the routing weight, then
the per-token sum. Decode and verify (1..16 tokens) run them with 16-pair tiles; prefill
(grouped_gemm.py) runs the same kernels with bigger tiles and a torch-sorted plan.

Each program takes one tile of the plan (router.py: one expert, up to BLOCK_M of its pairs) and
BLOCK_N output rows, and computes `W[rows] @ X[pairs]^T` with the weights as the MMA's A operand
(quant_int's "swap AB": the MMA's M is the weight rows even for one token). So a step reads the
weights of the experts it selected, each once however many tokens chose it, and nothing else;
empty tiles exit before any load. The grids depend on shapes only.

Weights. The routed experts of a layer are stacked along rows (`Matrix`): gate_up row
e * 2I + r (r < I gate, I <= r < 2I up), down row e * H + n, in bf16, in quant_int's packed
layout ("kb128-v1": see quant_int/formats.py) or in quant_nvfp4's prepared one ("g16-split8-f16",
a fp32 global scale per row, applied to the accumulator), decoded in registers by quant_int's own
block step (`_kb_step`: the same decode, scales and PTX fast path as its linear kernel). The shared expert
is expert id E (router.py), read from its own QLinears' weights, in its own format (SFMT), by a
runtime branch of the same program: one launch covers routed and shared experts.

Intermediates: gate_up writes h [pairs, I] in the activations' dtype (as the reference rounds
silu(gate) * up); down writes y [pairs, H] in fp32, already times the routing weight; `combine`
sums each token's slots in a fixed order (deterministic, unlike atomics) and rounds once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl
from ninfer.kernels.triton.launch import interpreting
from ninfer_plugins.moe_triton.router import Routing
from ninfer_plugins.quant_int.kernels import _kb_step

# Format ids: quant_int's (the code width) for the int formats, 16 for NVFP4 (quant_nvfp4's
# "g16-split8-f16" layout, quant_int's kernel id), 0 for weights in a float dtype.
DENSE_FMT = 0
INT_FMTS = (4, 5, 6, 8)
NVFP4_FMT = 16


@dataclass
class Matrix:
    """One weight, or a stack of experts' weights along rows, as the kernels read it.

    fmt 0: `q` is the float weight [rows, k]. Int formats: `q` the low-nibble plane (q8: the codes
    as uint8) [rows, Kp/2 or Kp], `s` the fp16 scales, `h` the high-bit plane (q5/q6)."""

    fmt: int
    q: torch.Tensor
    k: int
    s: torch.Tensor | None = None
    h: torch.Tensor | None = None
    # NVFP4: the fp32 global scale of each row [rows]
    g: torch.Tensor | None = None

    def args(self) -> tuple:
        """(q, h, s) pointers and their row strides; unused planes point at q."""
        h = self.h if self.h is not None else self.q
        s = self.s if self.s is not None else self.q
        return (self.q, h, s), (self.q.stride(0), h.stride(0), s.stride(0))

    def gscale(self) -> torch.Tensor:
        """The per-row global scale pointer (NVFP4), else q (never read)."""
        return self.g if self.g is not None else self.q

    @property
    def nbytes_per_row(self) -> int:
        rows = sum(t.stride(0) * t.element_size() for t in (self.q, self.s, self.h) if t is not None)
        return rows + (self.g.element_size() if self.g is not None else 0)


@dataclass(frozen=True)
class TileConfig:
    """Block sizes of one grouped launch. The defaults below are first choices, not yet
    measured: bench/moe.py sweeps them on the GPU (BENCHMARKS.md, "35B-A3B MoE")."""

    block_n: int
    block_m: int
    num_warps: int = 4
    num_stages: int = 3
    # dense K step
    block_k: int = 128
    # int formats: scales multiplied into the bf16 weights so successive dots chain (quant_int's
    # choice for M > 64); otherwise applied to the fp32 accumulator, exact codes
    scale_w: bool = False

    def describe(self) -> str:
        return f"BN{self.block_n} BM{self.block_m} w{self.num_warps} s{self.num_stages}{' SW' if self.scale_w else ''}"


# --- device code ------------------------------------------------------------------------------------


@triton.jit
def _dense_dot(w, x, DOT_F32: tl.constexpr):
    # Triton's interpreter multiplies bf16 dot operands as raw integers: upcast there
    if DOT_F32:
        d = tl.dot(w.to(tl.float32), x.to(tl.float32))
    else:
        d = tl.dot(w, x.to(w.dtype))
    return d


@triton.jit
def _acc_rows(acc, W, WH, WS, rows, sw, swh, sws, x_rows, m_ok, K,
              FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              FAST: tl.constexpr, DOT_F32: tl.constexpr, SCALE_W: tl.constexpr):
    """acc [BN, BM] += W[rows, :K] @ X[pairs, :K]^T; x_rows [1, BM] points at each pair's row."""
    r64 = rows.to(tl.int64)
    w_rows = W + r64[:, None] * sw
    if FMT == 0:
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(w_rows + k[None, :], mask=(k < K)[None, :], other=0.0)
            x = tl.load(x_rows + k[:, None], mask=m_ok[None, :] & (k < K)[:, None], other=0.0)
            acc += _dense_dot(w, x, DOT_F32)
    else:
        h_rows = WH + r64[:, None] * swh
        s_rows = WS + r64 * sws
        for kb in range(0, tl.cdiv(K, 128)):
            acc = _kb_step(acc, kb, w_rows, h_rows, s_rows, x_rows, m_ok, K, acc,
                           FMT, BLOCK_N, FAST, DOT_F32, SCALE_W, False)
    return acc


@triton.jit
def _acc_pair(g, u, GW, GWH, GWS, UW, UWH, UWS, g_rows, u_rows, sgw, sgwh, sgws, suw, suwh, suws, x_rows, m_ok, K,
              FMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              FAST: tl.constexpr, DOT_F32: tl.constexpr, SCALE_W: tl.constexpr):
    """_acc_rows for the gate and the up rows in one K loop: each trip has both weight tiles in
    flight (a decode program is latency-bound, so bytes in flight per trip set its speed); the
    dense path loads the activation tile once for both dots."""
    g64 = g_rows.to(tl.int64)
    u64 = u_rows.to(tl.int64)
    gw_rows = GW + g64[:, None] * sgw
    uw_rows = UW + u64[:, None] * suw
    if FMT == 0:
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            wg = tl.load(gw_rows + k[None, :], mask=(k < K)[None, :], other=0.0)
            wu = tl.load(uw_rows + k[None, :], mask=(k < K)[None, :], other=0.0)
            x = tl.load(x_rows + k[:, None], mask=m_ok[None, :] & (k < K)[:, None], other=0.0)
            g += _dense_dot(wg, x, DOT_F32)
            u += _dense_dot(wu, x, DOT_F32)
    else:
        gh_rows = GWH + g64[:, None] * sgwh
        uh_rows = UWH + u64[:, None] * suwh
        gs_rows = GWS + g64 * sgws
        us_rows = UWS + u64 * suws
        for kb in range(0, tl.cdiv(K, 128)):
            g = _kb_step(g, kb, gw_rows, gh_rows, gs_rows, x_rows, m_ok, K, g,
                         FMT, BLOCK_N, FAST, DOT_F32, SCALE_W, False)
            u = _kb_step(u, kb, uw_rows, uh_rows, us_rows, x_rows, m_ok, K, u,
                         FMT, BLOCK_N, FAST, DOT_F32, SCALE_W, False)
    return g, u


@triton.jit
def _global_scale(acc, G, rows, FMT: tl.constexpr, FAST: tl.constexpr):
    """NVFP4: acc [BN, BM] times each row's fp32 global scale (the block step decodes e2m1 times
    the e4m3 block scale only, and with FAST its PTX decode leaves the weights times 2^-7, undone
    here as quant_int's linear kernel does); other formats: acc."""
    if FMT == 16:
        g = tl.load(G + rows)
        if FAST:
            g = g * 128.0
        acc = acc * g[:, None]
    return acc


@triton.jit
def _tile(TILE_EXPERT, TILE_ROWS, BLOCK_M: tl.constexpr):
    tile = tl.program_id(0)
    e = tl.load(TILE_EXPERT + tile)
    pairs = tl.load(TILE_ROWS + tile * BLOCK_M + tl.arange(0, BLOCK_M))
    return e, pairs, pairs >= 0


@triton.jit
def _gate_up_kernel(
    X, TILE_EXPERT, TILE_ROWS, HOUT,
    W, WH, WS, GW, GWH, GWS, UW, UWH, UWS, WG, GWG, UWG,
    K, INNER, S_INNER, E, SLOTS,
    sx, sh, sw, swh, sws, sgw, sgwh, sgws, suw, suwh, suws,
    FMT: tl.constexpr, SFMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, FAST: tl.constexpr, DOT_F32: tl.constexpr, SCALE_W: tl.constexpr,
):
    e, pairs, m_ok = _tile(TILE_EXPERT, TILE_ROWS, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_lim = tl.where(e == E, S_INNER, INNER)
    if (e >= 0) & (tl.program_id(1) * BLOCK_N < n_lim):
        tok = tl.where(m_ok, pairs // SLOTS, 0)
        x_rows = X + tok[None, :].to(tl.int64) * sx
        g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if e == E:
            # rows past the end are clamped (their results are masked at the store): no row masks.
            # (Names differ per branch: the GPU compiler merges a name bound in both branches of a
            # runtime `if`, and rejects it when the types differ; the interpreter never checks.)
            rows_s = tl.minimum(n, S_INNER - 1)
            g, u = _acc_pair(g, u, GW, GWH, GWS, UW, UWH, UWS, rows_s, rows_s, sgw, sgwh, sgws, suw, suwh, suws,
                             x_rows, m_ok, K, SFMT, BLOCK_N, BLOCK_K, FAST, DOT_F32, SCALE_W)
            g = _global_scale(g, GWG, rows_s, SFMT, FAST)
            u = _global_scale(u, UWG, rows_s, SFMT, FAST)
        else:
            rows_e = e.to(tl.int64) * 2 * INNER + tl.minimum(n, INNER - 1)
            g, u = _acc_pair(g, u, W, WH, WS, W, WH, WS, rows_e, rows_e + INNER, sw, swh, sws, sw, swh, sws,
                             x_rows, m_ok, K, FMT, BLOCK_N, BLOCK_K, FAST, DOT_F32, SCALE_W)
            g = _global_scale(g, WG, rows_e, FMT, FAST)
            u = _global_scale(u, WG, rows_e + INNER, FMT, FAST)
        h = g * tl.sigmoid(g) * u
        out = HOUT + pairs[None, :].to(tl.int64) * sh + n[:, None]
        tl.store(out, h.to(HOUT.dtype.element_ty), mask=(n < n_lim)[:, None] & m_ok[None, :])


@triton.jit
def _down_kernel(
    HIN, TILE_EXPERT, TILE_ROWS, WEIGHTS, Y,
    W, WH, WS, SW, SWH, SWS, WG, SWG,
    N, INNER, S_INNER, E,
    sh, sy, sw, swh, sws, ssw, sswh, ssws,
    FMT: tl.constexpr, SFMT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, FAST: tl.constexpr, DOT_F32: tl.constexpr, SCALE_W: tl.constexpr,
):
    e, pairs, m_ok = _tile(TILE_EXPERT, TILE_ROWS, BLOCK_M)
    if e >= 0:
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        r = tl.minimum(n, N - 1)
        p64 = tl.where(m_ok, pairs, 0).to(tl.int64)
        x_rows = HIN + p64[None, :] * sh
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if e == E:
            acc = _acc_rows(acc, SW, SWH, SWS, r, ssw, sswh, ssws, x_rows, m_ok, S_INNER, SFMT, BLOCK_N, BLOCK_K, FAST, DOT_F32, SCALE_W)
            acc = _global_scale(acc, SWG, r, SFMT, FAST)
        else:
            rows_e = e.to(tl.int64) * N + r
            acc = _acc_rows(acc, W, WH, WS, rows_e, sw, swh, sws, x_rows, m_ok, INNER, FMT, BLOCK_N, BLOCK_K, FAST, DOT_F32, SCALE_W)
            acc = _global_scale(acc, WG, rows_e, FMT, FAST)
        wt = tl.load(WEIGHTS + p64, mask=m_ok, other=0.0)
        tl.store(Y + p64[None, :] * sy + n[:, None], acc * wt[None, :], mask=(n < N)[:, None] & m_ok[None, :])


@triton.jit
def _combine_kernel(Y, OUT, N, sy, so, SLOTS: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(SLOTS):
        acc += tl.load(Y + (t * SLOTS + j) * sy + n, mask=ok, other=0.0)
    tl.store(OUT + t * so + n, acc.to(OUT.dtype.element_ty), mask=ok)


# --- host side --------------------------------------------------------------------------------------


def _flags(fast: bool | None) -> dict:
    interp = interpreting()
    return {"FAST": (True if fast is None else fast) and not interp, "DOT_F32": interp}


def gate_up(
    x: torch.Tensor,
    r: Routing,
    routed: Matrix,
    inner: int,
    num_experts: int,
    cfg: TileConfig,
    shared: tuple[Matrix, Matrix] | None = None,
    shared_inner: int = 0,
    fast: bool | None = None,
) -> torch.Tensor:
    """h [T * slots, max(I, Is)] = silu(gate_e x_t) * up_e x_t for every pair of the plan."""
    if r.block_m != cfg.block_m:
        raise ValueError(f"plan tiles hold {r.block_m} pairs, the config {cfg.block_m}")
    width = max(inner, shared_inner if shared else 0)
    h = torch.empty(r.num_tokens * r.slots, width, dtype=x.dtype, device=x.device)
    if r.n_tiles == 0:
        return h
    g, u = shared if shared is not None else (routed, routed)
    (w, wh, ws), (sw, swh, sws) = routed.args()
    (gw, gwh, gws), (sgw, sgwh, sgws) = g.args()
    (uw, uwh, uws), (suw, suwh, suws) = u.args()
    grid = (r.n_tiles, triton.cdiv(width, cfg.block_n))
    _gate_up_kernel[grid](
        x, r.tile_expert, r.tile_rows, h,
        w, wh, ws, gw, gwh, gws, uw, uwh, uws, routed.gscale(), g.gscale(), u.gscale(),
        x.shape[1], inner, shared_inner if shared else 1, num_experts, r.slots,
        x.stride(0), h.stride(0), sw, swh, sws, sgw, sgwh, sgws, suw, suwh, suws,
        FMT=routed.fmt, SFMT=g.fmt, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        SCALE_W=cfg.scale_w, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_flags(fast),
    )
    return h


def down(
    h: torch.Tensor,
    r: Routing,
    routed: Matrix,
    hidden: int,
    inner: int,
    num_experts: int,
    cfg: TileConfig,
    shared: Matrix | None = None,
    shared_inner: int = 0,
    fast: bool | None = None,
) -> torch.Tensor:
    """y [T * slots, H] fp32 = weight_p * down_e h_p for every pair of the plan."""
    if r.block_m != cfg.block_m:
        raise ValueError(f"plan tiles hold {r.block_m} pairs, the config {cfg.block_m}")
    y = torch.empty(h.shape[0], hidden, dtype=torch.float32, device=h.device)
    if r.n_tiles == 0:
        return y
    s = shared if shared is not None else routed
    (w, wh, ws), (sw, swh, sws) = routed.args()
    (qw, qwh, qws), (ssw, sswh, ssws) = s.args()
    grid = (r.n_tiles, triton.cdiv(hidden, cfg.block_n))
    _down_kernel[grid](
        h, r.tile_expert, r.tile_rows, r.weights, y,
        w, wh, ws, qw, qwh, qws, routed.gscale(), s.gscale(),
        hidden, inner, shared_inner if shared is not None else 1, num_experts,
        h.stride(0), y.stride(0), sw, swh, sws, ssw, sswh, ssws,
        FMT=routed.fmt, SFMT=s.fmt, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        SCALE_W=cfg.scale_w, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_flags(fast),
    )
    return y


def combine(y: torch.Tensor, num_tokens: int, slots: int, dtype: torch.dtype) -> torch.Tensor:
    """out [T, H] = sum over each token's slots of y [T * slots, H] (fp32), rounded once."""
    hidden = y.shape[1]
    out = torch.empty(num_tokens, hidden, dtype=dtype, device=y.device)
    if num_tokens:
        block = min(1024, triton.next_power_of_2(hidden))
        _combine_kernel[(num_tokens, triton.cdiv(hidden, block))](
            y, out, hidden, y.stride(0), out.stride(0), SLOTS=slots, BLOCK=block, num_warps=4
        )
    return out


# --- the torch oracle -------------------------------------------------------------------------------


def experts_reference(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    shared_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Spec 2.5 in fp32 from the represented inputs: x [T, H]; ids, weights [T, k]; gate_up
    [E, 2I, H] and down [E, H, I] decoded weights; `shared` (gate [Is, H], up [Is, H], down
    [H, Is]) scaled per token by `shared_weight` [T] -> sum_k w_k down_e(silu(G_e x) * U_e x) [T, H].
    Loops over the experts in use (a host sync: an oracle, not a path).

    The intermediate h is rounded to x's dtype, as the kernels store it (`gate_up` writes h in the
    activation dtype, as a bf16 model does between its two expert GEMMs): that rounding is part of
    the computation, not an error of the kernels. Measured on the H200 before this was modelled:
    one value of 2M at 4.004x the per-value bound at T = 1,024 (normwise 0.39%)."""
    xf = x.float()
    inner = gate_up.shape[1] // 2
    out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        a = xf[rows] @ gate_up[e].float().T
        h = (F.silu(a[:, :inner]) * a[:, inner:]).to(x.dtype).float()
        out.index_add_(0, rows, (h @ down[e].float().T) * weights[rows, slot].float()[:, None])
    if shared is not None:
        g, u, d = (t.float() for t in shared)
        hs = (F.silu(xf @ g.T) * (xf @ u.T)).to(x.dtype).float()
        out += shared_weight.float()[:, None] * (hs @ d.T)
    return out


# Decode / verify (T <= 16): a 16-pair tile is the MMA's smallest N. gate_up runs 2 x BN weight
# rows per program (gate and up): BN 32 gives 16 row blocks x 9 tiles = 144 programs for one
# token on 132 SMs; down's 2048 rows in blocks of 64 give 32 x 9 = 288.
DECODE_GATE_UP = TileConfig(block_n=32, block_m=16, num_warps=4, num_stages=3)
DECODE_DOWN = TileConfig(block_n=64, block_m=16, num_warps=4, num_stages=3)
