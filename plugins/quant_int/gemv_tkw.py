"""Tensor-core K-walk GEMV (Gluon) for decode and the speculative verify (M = 1..8 activation
rows): gemv_kw's walk with gemv_tc's decode and MMAs.

Why (BENCHMARKS.md, seventeenth run): the K-walk GEMV (gemv_kw.py) moved the 27B's q4 gate+up at
85% of copy at M = 1, but its multiply-adds are f16x2 FMAs, one per two weights and activation
row, so M = 4 costs it 1.25-1.44x M = 1 (issue 3 asks <= 1.15x, and the MTP verify is an M = 4
step). gemv_tc's direct kernel does the products on the tensor cores (swap-AB mma.sync
m16n8k16: 16 weight rows x 16 k as A, 16 k x 8 tokens of x as B), so any M <= 8 costs the same
instructions, but it walks the rows of a K slice, as gemv_h2 does: x prepared by every CTA for
its slice, partials stored every trip, the slices summed by the last CTA.

How: a CTA owns R = 16 x num_warps rows; each warp walks its 16 rows along K (or a 1/SPLITS
share of it), TB K blocks of 128 a trip, the block PF (1-4) ahead loaded while this one is
decoded and multiplied (the first ones before the PDL wait: weights); or (PF = 0) two trips an
iteration, ping-pong, each trip's blocks loaded a whole trip ahead into registers no math is
reading. Why the second, and `pin`: on the H100 the first form reached only 48-55% of copy on
gate+up (BENCHMARKS.md, eighteenth run), and its SASS has ptxas moving every weight load of the
next blocks to the end of the loop body, so each trip waits a full memory latency. A warp
barrier (`bar.warp.sync`) after the loads keeps them where the code puts them (SASS checked). A block is gemv_tc's:
lane (g, t) loads 16 bytes of rows g and g + 8, decodes them in registers straight into its A
fragments (`_decode_block`, `_group_mma`), and reads x's B fragments for the block, prepared
once a launch by `xq` (one small launch: x scaled per token and K block by a power of two,
times the decode's factors, rounded to fp16, in the MMA's k order), from L1/L2: four 16-byte
loads a lane and block, lanes of tokens >= M masked off. The bias the decode leaves on the
codes comes off after the MMA with x's per-group sum, and the block's scaling with it:
acc += (c x inv + (-sum x inv)) x scale, two FMAs an accumulator element and group. No
cross-lane sums at all: the accumulator is the MMA's [16, 8] tile; SPLITS > 1 stores one fp32
partial a row, share and token, summed by the last share to arrive (gemv_tc's `_sum_slices`).

The arithmetic equals gemv_tc's with one K block a slice (`reference`): the CPU path and the
tests' oracle. Gluon has no interpreter: the prepared x (a Triton kernel) is checked under
TRITON_INTERPRET=1 against `xq_reference`, the kernel itself on the GPU (`-m gpu`) and compiled
for sm_90 by bench/tc_sass.py --tkw on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton.launch import lasting, pdl_kwargs, pdl_prologue, pdl_value
from ninfer.kernels.triton.norms import rmsnorm_row
from ninfer_plugins.quant_int import gemv_h2 as H2
from ninfer_plugins.quant_int import gemv_kw as KW
from ninfer_plugins.quant_int import gemv_tc as TC
from ninfer_plugins.quant_int import kernels as QK
from ninfer_plugins.quant_int.gemv_kw import _share, _shares_fit  # K shares of whole trips, ragged as gemv_kw's

MAX_M = 8
FORMATS = TC.FORMATS
XHEAD = TC.XHEAD
# set by bench/tc_sass.py: launch on CPU tensors (a compile-only driver)
COMPILE_ONLY = False


@dataclass(frozen=True)
class TKWConfig:
    tb: int = 2  # K blocks of 128 a trip (the unrolled inner loop)
    pf: int = 1  # blocks loaded ahead of the one being multiplied (1-4); 0: whole trips, ping-pong (TB 1, 2 or 4)
    num_warps: int = 4  # R = 16 x num_warps rows a CTA
    splits: int = 1  # K shares, summed by the last to arrive (rows too few to fill the GPU)
    # the blocks ahead kept ahead: a warp barrier after each block's loads, which ptxas does not
    # sink them below (without it they all sank to the loop's end: one latency a trip); the
    # ping-pong form always has it
    pin: bool = False
    # > 0: the weights through a cp.async ring in shared memory of this many trips (2-8; `pf` and
    # `pin` unused): bytes in flight that cost no registers (`_gemv_tkw_ring_kernel`)
    ring: int = 0

    def describe(self) -> str:
        if self.ring:
            return f"TKW TB{self.tb} R{self.ring} w{self.num_warps} S{self.splits}"
        return (f"TKW TB{self.tb} {'PP' if self.pf == 0 else f'P{self.pf}'} w{self.num_warps} S{self.splits}"
                + (" pin" if self.pin and self.pf else ""))

    def workspace(self, p: QK.Prepared) -> tuple[int, int]:
        return workspace_need(p, self)

    def run(self, x2: torch.Tensor, p: QK.Prepared, fast: bool | None = None) -> torch.Tensor:
        return launch(x2, p, self)


# shared memory a CTA's ring may take (bytes): an H100/H200 SM has 228 KB, two CTAs an SM at least
RING_SMEM = 112 * 1024


def ring_bytes(fmt: int, cfg: TKWConfig) -> int:
    """The ring's shared memory: per stage TB blocks of R rows, each 64 bytes of words, a 4-byte
    scale pair and (q5) 32 bytes of bit words."""
    per_block_row = 64 + 4 + (32 if fmt == 5 else 0)
    # + x's fragments, 2 KB a block, and (NINFER_TKW_XS=1, counted always) its sums, 128 bytes
    return cfg.ring * cfg.tb * (16 * cfg.num_warps * per_block_row + 2048 + 128)


# registers a thread of the ring kernel (sm_90, Triton 3.6, `bench/tc_sass.py --tkw`), the most seen
# over M, warps, stages and K shares for each format and TB: an estimate for `ring_waves`
RING_REGS = {4: {1: 64, 2: 72, 4: 96, 8: 128}, 5: {1: 82, 2: 104, 4: 112, 8: 168}}


def ring_waves(fmt: int, n: int, cfg: TKWConfig, sm_count: int, smem_per_sm: int = 228 * 1024,
               regs: int | None = None) -> tuple[int, int]:
    """(CTAs an SM, waves) of a ring config's grid, from shared memory (1 KB an SM is the
    driver's), registers (`regs` a thread, else RING_REGS; allocated per warp in units of 256, 64 K
    an SM) and threads. A K-walk CTA walks its rows' whole K, so a grid past one wave leaves its
    last CTAs walking alone: gate+up at M = 4 on the H100 took 43.3 us at 3 stages (5 CTAs an SM,
    one wave) and 56.6 at 4 (4 an SM, 16 CTAs in a second wave; BENCHMARKS.md, nineteenth run)."""
    regs = regs or RING_REGS[fmt][cfg.tb]
    by_regs = 65536 // (-(-regs * 32 // 256) * 256 * cfg.num_warps)
    per_sm = min(smem_per_sm // (ring_bytes(fmt, cfg) + 1024), by_regs, 2048 // (32 * cfg.num_warps), 32)
    return per_sm, -(-grid_ctas(n, cfg) // (max(1, per_sm) * sm_count))


def grid_ctas(n: int, cfg: TKWConfig) -> int:
    """CTAs of a launch over n rows: R = 16 x num_warps rows each, times the K shares."""
    return -(-n // (16 * cfg.num_warps)) * cfg.splits


def one_wave_rings(fmt: int, n: int, k: int, sm_count: int, count: int = 6) -> list[TKWConfig]:
    """Ring configs whose grid fits the GPU in one wave (`ring_waves`), most warps an SM first, then
    most bytes in flight (stages x TB), then fewest K shares: the candidates tkw_bench times per
    shape (the register forms' lists do not depend on the shape; the ring's best does)."""
    found = []
    for tb in (1, 2, 4):
        for ring in (2, 3, 4, 6):
            for splits in (1, 2, 4, 8):
                cfg = TKWConfig(tb, 1, 4, splits, False, ring)
                if not _fits(fmt, k, cfg):
                    continue
                per_sm, waves = ring_waves(fmt, n, cfg, sm_count)
                grid = grid_ctas(n, cfg)
                if waves == 1 and grid >= sm_count:
                    found.append((-min(per_sm, -(-grid // sm_count)), -ring * tb, splits, cfg))
    return [c for *_, c in sorted(found, key=lambda f: f[:3])][:count]


def xs_in_ring() -> bool:
    """NINFER_TKW_XS=1 (an experiment, off until timed on a GPU): the ring also streams each
    group's x scaling and bias sums (XS, 128 bytes a block), which otherwise come from L1/L2 a group
    at a time; the q5 shapes' CTAs each walk their own K share, so those loads miss L1."""
    return os.environ.get("NINFER_TKW_XS", "0") == "1"


def trips_of(k: int, cfg: TKWConfig) -> int:
    return k // (128 * cfg.tb)


def supports(p: QK.Prepared, cfg: TKWConfig) -> bool:
    return _fits(p.fmt, p.k, cfg)


def _fits(fmt: int, k: int, cfg: TKWConfig) -> bool:
    if fmt not in FORMATS or k % (128 * cfg.tb) or cfg.pf not in (0, 1, 2, 3, 4) or (cfg.pf == 0 and cfg.tb not in (1, 2, 4)) or cfg.num_warps not in (1, 2, 4, 8):
        return False
    if QK.ROW_PAD % (16 * cfg.num_warps) or cfg.splits < 1 or cfg.splits & (cfg.splits - 1):
        return False
    if cfg.ring and (not 2 <= cfg.ring <= 8 or cfg.tb & (cfg.tb - 1) or cfg.tb > 8 or ring_bytes(fmt, cfg) > RING_SMEM
                     or 4 * cfg.tb < cfg.num_warps):
        return False
    trips = trips_of(k, cfg)
    return trips >= 1 and _shares_fit(trips, cfg.splits)


def enabled() -> bool:
    """NINFER_TKW=1 (an experiment) sends every q4/q5 M <= 8 decode launch it fits to this kernel's
    measured winner (tuned.TUNED_TKW), else default_config; read at each launch."""
    return TC.HAVE_GLUON and os.environ.get("NINFER_TKW", "") == "1"


def tuned_allowed() -> bool:
    """The measured winners of tuned.TUNED_TKW are dispatched unless NINFER_TKW=0."""
    return TC.HAVE_GLUON and os.environ.get("NINFER_TKW", "") != "0"


def default_config(fmt: int, n: int, k: int, sm_count: int) -> TKWConfig | None:
    """64 rows a CTA, two K blocks a trip, and K shares (2, 4, 8) only while the row blocks alone
    give fewer than two CTAs an SM."""
    best = None
    for splits in (1, 2, 4, 8):
        cfg = TKWConfig(2, 1, 4, splits)
        if not _fits(fmt, k, cfg):
            break
        best = cfg
        if -(-n // 64) * splits >= 2 * sm_count:
            break
    return best


def workspace_need(p: QK.Prepared, cfg: TKWConfig) -> tuple[int, int]:
    """(partials, counters): one fp32 a row, share and token slot (8); one counter a row block."""
    if cfg.splits == 1:
        return 0, 0
    return cfg.splits * MAX_M * p.n, -(-p.n // (16 * cfg.num_warps))


# --- x, prepared once a launch ---------------------------------------------------------------------
#
# XQ [K / 64 groups, 2 jh, 8 n, 4 t, 8 v] fp16: element e = 16 t + 8 jh + 4 jl + 2 half + sel of a
# group (64 elements) of token n at v = half + 2 sel + 4 jl, i.e. gemv_tc's shared x (_prep_x) for
# every group of K; x times 2^e (e per token and K block: largest |x| in [2^XHEAD, 2^(XHEAD + 1)))
# times the decode's factor of the element's register (gemv_h2.X_FACTORS), rounded to fp16; zeros
# for tokens >= M. XS [K / 64 groups, 2, 8 n] fp32: 2^-e, and -2^-e x the group's sum of bias x
# stored x (the bias the decode leaves on the codes, gemv_tc.bias_of).


@triton.jit
def _xq_kernel(X, XQ, XS, M, stride_xm, GOFF,
               XF_A: tl.constexpr, XF_B: tl.constexpr, XF_C: tl.constexpr, XF_D: tl.constexpr,
               BIAS_A: tl.constexpr, BIAS_B: tl.constexpr, BIAS_C: tl.constexpr, BIAS_D: tl.constexpr,
               XH: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr = False):
    """Program kb: K block kb of every token slot (8) into XQ and XS."""
    kb = tl.program_id(0)
    pdl_prologue(PDL)
    n = tl.arange(0, 8)[:, None]
    e = tl.arange(0, 128)[None, :]
    ok = (n < M) & (e < 128)
    xv = H2._xval(X, X + n * stride_xm + kb * 128 + e, ok, GOFF, GATED)  # [8, 128] fp32, zeros past M
    _xq_tile(xv, kb + n * 0, n, n >= 0, XQ, XS, XF_A, XF_B, XF_C, XF_D, BIAS_A, BIAS_B, BIAS_C, BIAS_D, XH)


@triton.jit
def _xq_tile(xv, kb, n, ok, XQ, XS,
             XF_A: tl.constexpr, XF_B: tl.constexpr, XF_C: tl.constexpr, XF_D: tl.constexpr,
             BIAS_A: tl.constexpr, BIAS_B: tl.constexpr, BIAS_C: tl.constexpr, BIAS_D: tl.constexpr,
             XH: tl.constexpr):
    """xv [R, 128] fp32: K block kb [R, 1] of token slot n [R, 1], each row scaled on its own, into
    XQ and XS; rows where ok [R, 1] is false store nothing."""
    e = tl.arange(0, 128)[None, :]
    amax = tl.max(tl.abs(xv), 1, keep_dims=True)
    ex = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    sh = XH - tl.minimum(tl.maximum(ex, -100), 100)
    f = H2._pow2(sh)
    inv = H2._pow2(-sh)
    grp = e // 64
    e64 = e % 64
    sel = e64 % 2
    fac = tl.where(grp == 0, tl.where(sel == 0, XF_A, XF_C), tl.where(sel == 0, XF_B, XF_D))
    bias = tl.where(grp == 0, tl.where(sel == 0, BIAS_A, BIAS_C), tl.where(sel == 0, BIAS_B, BIAS_D))
    xs = (xv * f * fac).to(tl.float16)
    cb = xs.to(tl.float32) * bias
    cs0 = tl.sum(tl.where(grp == 0, cb, 0.0), 1, keep_dims=True)
    cs1 = tl.sum(tl.where(grp == 1, cb, 0.0), 1, keep_dims=True)
    t = e64 // 16
    jh = (e64 // 8) % 2
    jl = (e64 // 4) % 2
    half = (e64 // 2) % 2
    dst = (kb * 2 + grp) * 512 + jh * 256 + n * 32 + t * 8 + jl * 4 + sel * 2 + half
    tl.store(XQ + dst, xs, mask=ok & (e < 128))
    xs0 = XS + kb * 32 + n
    tl.store(xs0, inv, mask=ok)
    tl.store(xs0 + 8, -cs0 * inv, mask=ok)
    tl.store(xs0 + 16, inv, mask=ok)
    tl.store(xs0 + 24, -cs1 * inv, mask=ok)


@triton.jit
def _norm_xq_kernel(X, RES, W, Y, XQ, XS, sx, sr, sy, n_cols, eps, N, NKB,
                    BLOCK: tl.constexpr, HAS_RES: tl.constexpr, NKB_P2: tl.constexpr,
                    XF_A: tl.constexpr, XF_B: tl.constexpr, XF_C: tl.constexpr, XF_D: tl.constexpr,
                    BIAS_A: tl.constexpr, BIAS_B: tl.constexpr, BIAS_C: tl.constexpr, BIAS_D: tl.constexpr,
                    XH: tl.constexpr, PDL: tl.constexpr = False):
    """Program n < N: norms.rmsnorm's (1 + w) RMSNorm of row n (after residual += x with HAS_RES)
    into Y, then that row's prepared x over every K block (read back from Y, a barrier between);
    programs N..7: the token slots past N as _xq_kernel writes them (zeros)."""
    pdl_prologue(PDL)
    n = tl.program_id(0)
    kb = tl.arange(0, NKB_P2)[:, None]
    e = tl.arange(0, 128)[None, :]
    kbc = tl.minimum(kb, NKB - 1)
    if n < N:
        rmsnorm_row(X, RES, W, Y, n.to(tl.int64), sx, sr, sy, n_cols, eps, BLOCK, True, HAS_RES)
        tl.debug_barrier()
        xv = tl.load(Y + n.to(tl.int64) * sy + kbc * 128 + e).to(tl.float32)
    else:
        xv = tl.zeros([NKB_P2, 128], tl.float32)
    _xq_tile(xv, kbc, n + kb * 0, kb < NKB, XQ, XS, XF_A, XF_B, XF_C, XF_D, BIAS_A, BIAS_B, BIAS_C, BIAS_D, XH)


def xq_scratch(device: torch.device, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(XQ, XS) kept per (device, K) for the life of the process (a CUDA graph reuses the
    pointers); made on first use, which must not be inside a capture: reserve_workspace asks for
    it at load."""
    groups = k // 64

    def make():
        return (torch.zeros(groups * 512, dtype=torch.float16, device=device),
                torch.zeros(groups * 16, dtype=torch.float32, device=device))

    return lasting("gemv_tkw_x", device, (k,), make)


def _consts(fmt: int) -> dict:
    """The decode's factors and biases of a format, as _xq_tile takes them."""
    xf = H2.X_FACTORS[fmt]
    bias = [TC.bias_of(fmt, i) for i in range(4)]
    return dict(XF_A=xf[0], XF_B=xf[1], XF_C=xf[2], XF_D=xf[3], BIAS_A=bias[0], BIAS_B=bias[1], BIAS_C=bias[2],
                BIAS_D=bias[3], XH=XHEAD)


def _xq_key(device: torch.device, k: int) -> tuple:
    return ("tkw", str(device), k)


def xq(x2: torch.Tensor, fmt: int, k: int, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x2 [M, k] (gated: [M, 2k], silu(gate) * up) -> (XQ, XS) in xq_scratch."""
    xqb, xsb = xq_scratch(x2.device, k)
    _xq_kernel[(k // 128,)](
        x2, xqb, xsb, x2.shape[0], x2.stride(0), k if gated else 0,
        GATED=gated, num_warps=2, **_consts(fmt), **pdl_kwargs(x2.device, scoped=False),
    )
    if KW.reuse_inputs():
        KW.note_input(_xq_key(x2.device, k), x2, (fmt, gated))
    return xqb, xsb


def norm_xq(x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: int,
            residual: torch.Tensor | None = None) -> torch.Tensor:
    """norms.rmsnorm(x, weight, eps, residual=residual) (the (1 + w) form; residual += x in place
    first, when given) and, in the same launch, `xq` of the result for a weight of format fmt,
    noted (NINFER_KW_XREUSE=1) so that the tensor-core K-walk on the result skips its own xq
    launch. x [N <= 8, K], K a multiple of 128 (gemv_kw.norm_pairs is the f16x2 K-walk's)."""
    n, k = x.shape
    if not 0 < n <= MAX_M or k % 128 or fmt not in FORMATS:
        raise ValueError(f"norm_xq takes 1..{MAX_M} rows of a multiple of 128 in {FORMATS}, got {n} x {k}, format {fmt}")
    res = residual if residual is not None else x
    if x.stride(1) != 1 or res.stride(1) != 1 or (residual is not None and residual.shape != x.shape):
        raise ValueError("norm_xq needs unit last strides and a residual of x's shape")
    out = torch.empty(n, k, dtype=x.dtype, device=x.device)
    xqb, xsb = xq_scratch(x.device, k)
    block = triton.next_power_of_2(k)
    nkb = k // 128
    _norm_xq_kernel[(MAX_M,)](
        x, res, weight, out, xqb, xsb, x.stride(0), res.stride(0), out.stride(0), k, eps, n, nkb,
        BLOCK=block, HAS_RES=residual is not None, NKB_P2=triton.next_power_of_2(nkb),
        num_warps=min(16, max(1, block // 512)), **_consts(fmt), **pdl_kwargs(x.device),
    )
    if KW.reuse_inputs():
        KW.note_input(_xq_key(out.device, k), out, (fmt, False))
    return out


def gated_input(x2: torch.Tensor, k: int) -> torch.Tensor:
    """silu(gate) * up of [M, 2k] rows [gate | up], rounded to x2's dtype (as silu_mul stores it)."""
    g, u = x2[:, :k].float(), x2[:, k:2 * k].float()
    return (g * torch.sigmoid(g) * u).to(x2.dtype)


def xq_reference(x2: torch.Tensor, fmt: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What _xq_kernel writes, in torch (the tests' oracle)."""
    m = x2.shape[0]
    x = torch.zeros((8, k), dtype=torch.float32)
    x[:m] = x2[:, :k].float().cpu()
    nkb = k // 128
    xb = x.reshape(8, nkb, 128)
    amax = xb.abs().amax(dim=2)  # [8, nkb]
    ex = ((amax.view(torch.int32) >> 23) & 0xFF) - 127
    sh = XHEAD - ex.clamp(-100, 100)
    f, inv = torch.exp2(sh.float()), torch.exp2(-sh.float())
    e = torch.arange(128)
    grp, sel = e // 64, e % 2
    xf = H2.X_FACTORS[fmt]
    bias = [TC.bias_of(fmt, i) for i in range(4)]
    fac = torch.where(grp == 0, torch.where(sel == 0, xf[0], xf[2]), torch.where(sel == 0, xf[1], xf[3]))
    bs = torch.where(grp == 0, torch.where(sel == 0, bias[0], bias[2]), torch.where(sel == 0, bias[1], bias[3]))
    xs = (xb * f[:, :, None] * fac).to(torch.float16)  # [8, nkb, 128]
    cb = xs.float() * bs
    cs = torch.stack([cb[:, :, :64].sum(2), cb[:, :, 64:].sum(2)], dim=2)  # [8, nkb, 2]
    # [8 n, nkb, 2 grp, 4 t, 2 jh, 2 jl, 2 half, 2 sel] -> [nkb, grp, jh, n, t, jl, sel, half]
    q = xs.reshape(8, nkb, 2, 4, 2, 2, 2, 2).permute(1, 2, 4, 0, 3, 5, 7, 6).reshape(-1)
    s = torch.stack([inv[:, :, None].expand(8, nkb, 2), -cs * inv[:, :, None]], dim=0)  # [2, 8, nkb, 2]
    s = s.permute(2, 3, 0, 1).reshape(-1)  # [nkb, grp, (inv, -sum x inv), n]
    return q, s


def reference(x2: torch.Tensor, p: QK.Prepared, w: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's arithmetic in torch (CPU path and test oracle): gemv_tc's with one K block a
    slice (x scaled per token and block by a power of two, rounded to fp16; exact fp32 weights,
    or `w`, p already dequantized)."""
    return TC.reference(x2, p, TC.TCConfig(kb=1), w)


# --- the kernel ------------------------------------------------------------------------------

if TC.HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

    _tbarrier = getattr(gl, "thread_barrier", None) or getattr(gl, "barrier", None)

    @gluon.jit
    def _x_group(acc, d, sg, XQ, XS, gi, xoff, xmask, cn, R: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr,
                 B_L: gl.constexpr):
        """acc += one group's products: codes d (biased) times x's fragments (loaded from XQ), the
        bias and x's scaling off in two FMAs, times the rows' group scale."""
        xb = gl.load(XQ + gi * 512 + xoff, mask=xmask, other=0.0)
        return _x_group_of(acc, d, sg, xb, XS, gi, cn, R, MMA, A_L, B_L)

    @gluon.jit
    def _x_group_of(acc, d, sg, xb, XS, gi, cn, R: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr,
                    B_L: gl.constexpr):
        """_x_group with x's fragments xb [2 jh, 8 n, 4 t, 8 v] given (the ring's shared copy)."""
        iv = gl.load(XS + gi * 16 + cn)
        nc = gl.load(XS + gi * 16 + 8 + cn)
        return _x_group_sums(acc, d, sg, xb, iv, nc, R, MMA, A_L, B_L)

    @gluon.jit
    def _x_group_sums(acc, d, sg, xb, iv, nc, R: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr,
                      B_L: gl.constexpr):
        """_x_group_of with the group's x scaling (iv [8]) and bias sums (nc [8]) given as well."""
        c = TC._group_mma(d, xb, R, MMA, A_L, B_L)
        return acc + (c * iv[None, :] + nc[None, :]) * sg[:, None]

    @gluon.jit
    def _issue_xs(XS, xss, slot, kb0, TB: gl.constexpr, LXS: gl.constexpr):
        """cp.async the x scalings and bias sums of blocks kb0..kb0+TB-1 (XS's [2 TB groups, 16]
        fp32, contiguous) into ring slot `slot`, 4 bytes a copy."""
        e = gl.arange(0, 32 * TB, layout=LXS)
        cp.async_copy_global_to_shared(xss.index(slot), XS + kb0 * 32 + e)

    @gluon.jit
    def _issue_x(XQ, xsm, slot, kb0, M, TB: gl.constexpr, LCX: gl.constexpr):
        """cp.async x's fragments of blocks kb0..kb0+TB-1 (XQ's [2 TB groups x 2 jh, 8 n, 4 t, 8 v],
        contiguous) into ring slot `slot`, 16 bytes a copy; token slots >= M are not read (zeros)."""
        L3: gl.constexpr = gl.SliceLayout(3, LCX)
        L2: gl.constexpr = gl.SliceLayout(2, L3)
        # dim d of the 4-D tile: LCX sliced on every other dim, the highest innermost
        a0 = gl.arange(0, 4 * TB, layout=gl.SliceLayout(1, L2))
        a1 = gl.arange(0, 8, layout=gl.SliceLayout(0, L2))
        a2 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        a3 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LCX))))
        off = ((a0 * 256)[:, None, None, None] + (a1 * 32)[None, :, None, None] + (a2 * 8)[None, None, :, None]
               + a3[None, None, None, :])
        live = (a1 < M)[None, :, None, None] & (a3 < 8)[None, None, None, :]
        cp.async_copy_global_to_shared(xsm.index(slot), XQ + kb0 * 1024 + off, mask=live)

    @gluon.jit
    def _pin_loads():
        """A warp barrier: ptxas does not move the loads issued before it below it (without it, the
        SASS had every next-trip load sunk below the current trip's math; bar.warp.sync orders the
        warp's memory accesses)."""
        gl.inline_asm_elementwise("bar.warp.sync -1; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _load_trip(wp, sp, hp, row0, kb, kb_last, stride_wn, stride_hn, stride_sn, FMT: gl.constexpr, TB: gl.constexpr):
        """Blocks kb..kb+TB-1 (each clamped to kb_last) into registers: (w, s, h) of each, four
        slots, the slots past TB repeating block kb (the same values: no loads, no registers)."""
        w0, s0, h0 = TC._load_block(wp, sp, hp, row0, gl.minimum(kb, kb_last), stride_wn, stride_hn, stride_sn, FMT)
        w1, s1, h1 = w0, s0, h0
        w2, s2, h2 = w0, s0, h0
        w3, s3, h3 = w0, s0, h0
        if TB >= 2:
            w1, s1, h1 = TC._load_block(wp, sp, hp, row0, gl.minimum(kb + 1, kb_last), stride_wn, stride_hn, stride_sn, FMT)
        if TB >= 4:
            w2, s2, h2 = TC._load_block(wp, sp, hp, row0, gl.minimum(kb + 2, kb_last), stride_wn, stride_hn, stride_sn, FMT)
            w3, s3, h3 = TC._load_block(wp, sp, hp, row0, gl.minimum(kb + 3, kb_last), stride_wn, stride_hn, stride_sn, FMT)
        return w0, s0, h0, w1, s1, h1, w2, s2, h2, w3, s3, h3

    @gluon.jit
    def _x_block(acc, w, s, h, kb, XQ, XS, xoff, xmask, cn, FMT: gl.constexpr, R: gl.constexpr, ASM: gl.constexpr,
                 CONSTR: gl.constexpr, L5: gl.constexpr, LH3: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr,
                 B_L: gl.constexpr):
        """acc += one K block's products (its two groups)."""
        d_lo, d_hi, s_lo, s_hi = TC._decode_block(w, s, h, FMT, R, ASM, CONSTR, L5, LH3)
        acc = _x_group(acc, d_lo, s_lo, XQ, XS, kb * 2, xoff, xmask, cn, R, MMA, A_L, B_L)
        return _x_group(acc, d_hi, s_hi, XQ, XS, kb * 2 + 1, xoff, xmask, cn, R, MMA, A_L, B_L)

    @gluon.jit
    def _x_trip(acc, w0, s0, h0, w1, s1, h1, w2, s2, h2, w3, s3, h3, kb, XQ, XS, xoff, xmask, cn,
                FMT: gl.constexpr, TB: gl.constexpr, R: gl.constexpr, ASM: gl.constexpr, CONSTR: gl.constexpr,
                L5: gl.constexpr, LH3: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr):
        """acc += a trip's TB blocks (from _load_trip's slots)."""
        acc = _x_block(acc, w0, s0, h0, kb, XQ, XS, xoff, xmask, cn, FMT, R, ASM, CONSTR, L5, LH3, MMA, A_L, B_L)
        if TB >= 2:
            acc = _x_block(acc, w1, s1, h1, kb + 1, XQ, XS, xoff, xmask, cn, FMT, R, ASM, CONSTR, L5, LH3, MMA, A_L, B_L)
        if TB >= 4:
            acc = _x_block(acc, w2, s2, h2, kb + 2, XQ, XS, xoff, xmask, cn, FMT, R, ASM, CONSTR, L5, LH3, MMA, A_L, B_L)
            acc = _x_block(acc, w3, s3, h3, kb + 3, XQ, XS, xoff, xmask, cn, FMT, R, ASM, CONSTR, L5, LH3, MMA, A_L, B_L)
        return acc

    @gluon.jit(do_not_specialize=["M", "N", "TRIPS", "ITERS"])
    def _gemv_tkw_kernel(
        XQ, XS, W, H, S, Y, WS, CNT,
        M, N, TRIPS, ITERS,
        stride_wn, stride_hn, stride_sn, stride_ym,
        FMT: gl.constexpr, TB: gl.constexpr, PF: gl.constexpr, R: gl.constexpr, SPLITS: gl.constexpr,
        RED: gl.constexpr, MT: gl.constexpr, PDL: gl.constexpr, LATE: gl.constexpr, PIN: gl.constexpr,
        ASM: gl.constexpr, CONSTR: gl.constexpr,
        L5: gl.constexpr, LB4: gl.constexpr, LH3: gl.constexpr, LRED: gl.constexpr,
        MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr,
    ):
        pid_r = gl.program_id(0)
        pid_s = gl.program_id(1)
        row0 = pid_r * R  # rows are padded to ROW_PAD, a multiple of R: loads need no mask
        it0 = pid_s * ITERS
        n_it = gl.minimum(ITERS, TRIPS - it0)  # >= 1 (_fits)
        kb_first = it0 * TB
        kb_last = kb_first + n_it * TB - 1

        # the first blocks go out before waiting on the kernel before (weights: no kernel writes them)
        wp, sp, hp = TC._block_ptrs(W, H, S, stride_wn, stride_hn, stride_sn, FMT, R, L5, MMA, LH3)
        if PF == 0:
            # ping-pong: trip A's registers, then trip B's, each loaded a whole trip before its math
            wa0, sa0, ha0, wa1, sa1, ha1, wa2, sa2, ha2, wa3, sa3, ha3 = _load_trip(
                wp, sp, hp, row0, kb_first, kb_last, stride_wn, stride_hn, stride_sn, FMT, TB)
        else:
            wa, sa, ha = TC._load_block(wp, sp, hp, row0, kb_first, stride_wn, stride_hn, stride_sn, FMT)
        if PF >= 2:
            wb_, sb_, hb_ = TC._load_block(wp, sp, hp, row0, gl.minimum(kb_first + 1, kb_last), stride_wn, stride_hn,
                                           stride_sn, FMT)
        if PF >= 3:
            wc_, sc_, hc_ = TC._load_block(wp, sp, hp, row0, gl.minimum(kb_first + 2, kb_last), stride_wn, stride_hn,
                                           stride_sn, FMT)
        if PF >= 4:
            wd_, sd_, hd_ = TC._load_block(wp, sp, hp, row0, gl.minimum(kb_first + 3, kb_last), stride_wn, stride_hn,
                                           stride_sn, FMT)
        TC._pdl_wait(PDL, LATE)

        # x's fragments of a group [2 jh, 8 n, 4 t, 8 v]: lane (g = n, t) reads 2 x 16 bytes
        jh = gl.arange(0, 2, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LB4))))
        nx = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LB4))))
        tx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LB4))))
        vx = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LB4))))
        xoff = (jh[:, None, None, None] * 256 + nx[None, :, None, None] * 32 + tx[None, None, :, None] * 8
                + vx[None, None, None, :])
        xmask = ((xoff // 32) % 8) < M
        cn = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))

        acc = gl.zeros([R, 8], gl.float32, layout=MMA)
        if PF == 0:
            # two trips an iteration: B's loads go out before A's math, the next A's before B's,
            # into registers no math is reading (a trip past the share's end reloads its last block)
            for i in range(0, n_it, 2):
                kb = kb_first + i * TB
                wb0, sb0, hb0, wb1, sb1, hb1, wb2, sb2, hb2, wb3, sb3, hb3 = _load_trip(
                    wp, sp, hp, row0, kb + TB, kb_last, stride_wn, stride_hn, stride_sn, FMT, TB)
                _pin_loads()
                acc = _x_trip(acc, wa0, sa0, ha0, wa1, sa1, ha1, wa2, sa2, ha2, wa3, sa3, ha3, kb, XQ, XS, xoff, xmask,
                              cn, FMT, TB, R, ASM, CONSTR, L5, LH3, MMA, A_L, B_L)
                wa0, sa0, ha0, wa1, sa1, ha1, wa2, sa2, ha2, wa3, sa3, ha3 = _load_trip(
                    wp, sp, hp, row0, kb + 2 * TB, kb_last, stride_wn, stride_hn, stride_sn, FMT, TB)
                _pin_loads()
                if i + 1 < n_it:
                    acc = _x_trip(acc, wb0, sb0, hb0, wb1, sb1, hb1, wb2, sb2, hb2, wb3, sb3, hb3, kb + TB, XQ, XS, xoff,
                                  xmask, cn, FMT, TB, R, ASM, CONSTR, L5, LH3, MMA, A_L, B_L)
        else:
            for i in range(n_it):
                for j in gl.static_range(TB):
                    kb = kb_first + i * TB + j
                    # the block PF ahead, the share's last one again past its end (stays in bounds)
                    wn, sn, hn = TC._load_block(wp, sp, hp, row0, gl.minimum(kb + PF, kb_last), stride_wn, stride_hn,
                                                stride_sn, FMT)
                    if PIN:
                        _pin_loads()
                    acc = _x_block(acc, wa, sa, ha, kb, XQ, XS, xoff, xmask, cn, FMT, R, ASM, CONSTR, L5, LH3, MMA, A_L, B_L)
                    # the blocks in flight move up one (renamings within the unrolled trip: TB a
                    # multiple of PF leaves no copies at the loop's end)
                    if PF == 1:
                        wa, sa, ha = wn, sn, hn
                    elif PF == 2:
                        wa, sa, ha = wb_, sb_, hb_
                        wb_, sb_, hb_ = wn, sn, hn
                    elif PF == 3:
                        wa, sa, ha = wb_, sb_, hb_
                        wb_, sb_, hb_ = wc_, sc_, hc_
                        wc_, sc_, hc_ = wn, sn, hn
                    else:
                        wa, sa, ha = wb_, sb_, hb_
                        wb_, sb_, hb_ = wc_, sc_, hc_
                        wc_, sc_, hc_ = wd_, sd_, hd_
                        wd_, sd_, hd_ = wn, sn, hn

        _finish(acc, Y, WS, CNT, pid_r, pid_s, row0, cn, M, N, stride_ym, R, SPLITS, RED, MT, PDL, LATE, LRED, MMA)

    @gluon.jit
    def _finish(acc, Y, WS, CNT, pid_r, pid_s, row0, cn, M, N, stride_ym, R: gl.constexpr, SPLITS: gl.constexpr,
                RED: gl.constexpr, MT: gl.constexpr, PDL: gl.constexpr, LATE: gl.constexpr, LRED: gl.constexpr,
                MMA: gl.constexpr):
        """The CTA's [R, 8] tile out: straight to y, or (SPLITS > 1) a partial, the last share to
        arrive summing them."""
        ym = gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
        rows = row0 + ym
        keep = (rows < N)[:, None] & (cn < M)[None, :]
        if SPLITS == 1:
            if PDL and LATE:
                TC._pdl_trigger()
            gl.store(Y + cn[None, :] * stride_ym + rows[:, None], acc.to(Y.dtype.element_ty), mask=keep)
        else:
            dst = WS + rows.to(gl.int64)[:, None] + ((pid_s * 8 + cn) * N).to(gl.int64)[None, :]
            gl.store(dst, acc, mask=keep)
            if PDL and LATE:
                TC._pdl_trigger()
            _tbarrier()
            TC._sum_slices(Y, WS, CNT, pid_r, row0, gl.minimum(row0 + R, N), M, N, stride_ym, SPLITS, SPLITS, RED, MT,
                           LRED)

    @gluon.jit(do_not_specialize=["M", "N", "TRIPS", "ITERS"])
    def _gemv_tkw_ring_kernel(
        XQ, XS, W, H, S, Y, WS, CNT,
        M, N, TRIPS, ITERS,
        stride_wn, stride_hn, stride_sn, stride_ym,
        FMT: gl.constexpr, TB: gl.constexpr, NS: gl.constexpr, R: gl.constexpr, SPLITS: gl.constexpr,
        RED: gl.constexpr, MT: gl.constexpr, PDL: gl.constexpr, LATE: gl.constexpr,
        ASM: gl.constexpr, CONSTR: gl.constexpr,
        L5: gl.constexpr, LB4: gl.constexpr, LH3: gl.constexpr, LRED: gl.constexpr,
        LCW: gl.constexpr, LCS: gl.constexpr, LCH: gl.constexpr, SH3: gl.constexpr, SH1: gl.constexpr,
        LCX: gl.constexpr, SH4: gl.constexpr, XSR: gl.constexpr, LXS: gl.constexpr,
        MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr,
    ):
        """The K-walk with its weights and x's fragments through a cp.async ring: NS stages of one trip each (TB
        blocks of the CTA's R rows: words, scale pairs, q5 bit words, gemv_tc's `_issue`), NS - 1
        trips in flight while the warps decode and multiply the oldest. gemv_tc's ring kernel's
        protocol: wait for the oldest trip's group, a CTA barrier (every warp's copies landed, and
        every warp is done with the slot about to be refilled), refill, compute."""
        pid_r = gl.program_id(0)
        pid_s = gl.program_id(1)
        row0 = pid_r * R
        it0 = pid_s * ITERS
        n_it = gl.minimum(ITERS, TRIPS - it0)  # >= 1 (_fits)
        kb_first = it0 * TB

        wsm, ssm, hsm = TC._ring_buffers(NS, TB, R, FMT, SH3, SH1)
        xsm = gl.allocate_shared_memory(gl.float16, [NS, 4 * TB, 8, 4, 8], SH4)  # [group x jh, n, t, v] a trip
        if XSR:
            xss = gl.allocate_shared_memory(gl.float32, [NS, 32 * TB], SH1)  # [group, (inv, -sum x inv) x 8 n] a trip
        else:
            xss = ssm
        # the first trips' weights go out before waiting on the kernel before (no kernel writes them),
        # their x after it (the x preparation writes XQ); past the share's end its last trip again
        # (in bounds, never read)
        for i in gl.static_range(NS - 1):
            TC._issue(W, H, S, wsm, hsm, ssm, i, row0, kb_first + gl.minimum(i, n_it - 1) * TB, stride_wn, stride_hn,
                      stride_sn, FMT, TB, R, LCW, LCS, LCH)
        TC._pdl_wait(PDL, LATE)
        # one commit group a trip: trip i's weights and x (the weights' copies above join the groups
        # of their trips' x: wait_group counts groups, and the first group holds every early weight)
        for i in gl.static_range(NS - 1):
            kb_i = kb_first + gl.minimum(i, n_it - 1) * TB
            _issue_x(XQ, xsm, i, kb_i, M, TB, LCX)
            if XSR:
                _issue_xs(XS, xss, i, kb_i, TB, LXS)
            cp.commit_group()

        cn = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
        LN: gl.constexpr = gl.SliceLayout(0, MMA)
        acc = gl.zeros([R, 8], gl.float32, layout=MMA)
        for i in range(n_it):
            cp.wait_group(NS - 2)
            _tbarrier()
            slot = i % NS
            nxt = (i + NS - 1) % NS
            kb_n = kb_first + gl.minimum(i + NS - 1, n_it - 1) * TB
            TC._issue(W, H, S, wsm, hsm, ssm, nxt, row0, kb_n, stride_wn, stride_hn, stride_sn, FMT, TB, R, LCW, LCS, LCH)
            _issue_x(XQ, xsm, nxt, kb_n, M, TB, LCX)
            if XSR:
                _issue_xs(XS, xss, nxt, kb_n, TB, LXS)
            cp.commit_group()
            xs_slot = xsm.index(slot)
            for j in gl.static_range(TB):
                w = wsm.index(slot).slice(j * R, R).load(gl.SliceLayout(3, L5))  # [R, 4 t, 4 j]
                sc = ssm.index(slot).slice(j * R, R).load(gl.SliceLayout(1, MMA))  # fp16 pair (group 2kb, 2kb + 1)
                if FMT == 5:
                    hw = hsm.index(slot).slice(j * R, R).load(LH3)  # [R, 4 t, 2]
                else:
                    hw = sc
                kb = kb_first + i * TB + j
                d_lo, d_hi, s_lo, s_hi = TC._decode_block(w, sc, hw, FMT, R, ASM, CONSTR, L5, LH3)
                if XSR:
                    sums = xss.index(slot)
                    acc = _x_group_sums(acc, d_lo, s_lo, xs_slot.slice(4 * j, 2).load(LB4), sums.slice(32 * j, 8).load(LN),
                                        sums.slice(32 * j + 8, 8).load(LN), R, MMA, A_L, B_L)
                    acc = _x_group_sums(acc, d_hi, s_hi, xs_slot.slice(4 * j + 2, 2).load(LB4),
                                        sums.slice(32 * j + 16, 8).load(LN), sums.slice(32 * j + 24, 8).load(LN), R, MMA,
                                        A_L, B_L)
                else:
                    acc = _x_group_of(acc, d_lo, s_lo, xs_slot.slice(4 * j, 2).load(LB4), XS, kb * 2, cn, R, MMA, A_L,
                                      B_L)
                    acc = _x_group_of(acc, d_hi, s_hi, xs_slot.slice(4 * j + 2, 2).load(LB4), XS, kb * 2 + 1, cn, R, MMA,
                                      A_L, B_L)
        cp.wait_group(0)
        _finish(acc, Y, WS, CNT, pid_r, pid_s, row0, cn, M, N, stride_ym, R, SPLITS, RED, MT, PDL, LATE, LRED, MMA)


# --- host side -------------------------------------------------------------------------------


def _x_copy_layout(num_warps: int):
    """x's fragments of a trip [2 TB groups x 2 jh, 8 n, 4 t, 8 v] as the ring copies them: 8 fp16
    (16 bytes) a copy, lanes over (n, t), warps over the first dim (no copy twice: 4 TB >=
    num_warps, `_fits`)."""
    return gl.BlockedLayout([1, 1, 1, 8], [1, 8, 4, 1], [num_warps, 1, 1, 1], [3, 2, 1, 0])


def launch(x2: torch.Tensor, p: QK.Prepared, cfg: TKWConfig, gated: bool = False) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T for M <= 8 rows (gated: x2 is [M, 2k] and the input is
    silu(gate) * up, rounded to x2's dtype). Two launches: x prepared (xq), then the GEMV."""
    m = x2.shape[0]
    kx = 2 * p.k if gated else p.k
    if x2.shape[1] != kx or x2.stride(1) != 1:
        raise ValueError(f"the tensor-core K-walk GEMV's input is [M, {kx}] with a unit last stride, got "
                         f"{tuple(x2.shape)} strides {tuple(x2.stride())}")
    if m > MAX_M:
        raise ValueError(f"the tensor-core K-walk GEMV takes at most {MAX_M} rows, got {m}")
    if not supports(p, cfg):
        raise ValueError(f"the tensor-core K-walk GEMV needs q4/q5, K a multiple of {128 * cfg.tb}, PF 1-4 (or 0 with TB 1, 2, 4), a "
                         f"power-of-two split with at least one trip a share (format {p.fmt}, K={p.k}, {cfg.describe()})")
    if (x2.device.type != "cuda" and not COMPILE_ONLY) or QK.interpreting():
        return reference(gated_input(x2, p.k) if gated else x2, p)
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    if not x2.is_cuda or (KW.reuse_inputs() and KW.holds_input(_xq_key(x2.device, p.k), x2, (p.fmt, gated))):
        # compile-only, or x2's already (NINFER_KW_XREUSE=1: made by the norm before, or a launch before)
        xqb, xsb = xq_scratch(x2.device, p.k)
    else:
        xqb, xsb = xq(x2, p.fmt, p.k, gated)
    if cfg.splits > 1:
        ws = QK.Workspace.get(x2.device)
        ws.ensure(*workspace_need(p, cfg), QK.capturing(x2))
        partials, counters = ws.partials, ws.counters
    else:
        partials = counters = xsb  # never read
    w = p.qweight.view(torch.int32)
    h = p.qhigh.view(torch.int32) if p.qhigh is not None else w
    s = p.scales.view(torch.int32)
    trips = trips_of(p.k, cfg)
    mt = 1 << max(0, (m - 1).bit_length())
    pdl = pdl_kwargs(x2.device) if x2.is_cuda else ({"PDL": pdl_value()} if COMPILE_ONLY == "pdl" else {})
    R = 16 * cfg.num_warps
    # the ring's copy layouts depend on its trip (kb = TB); the register forms' layouts do not
    c = TC._consts(p.fmt, TC.TCConfig(kb=cfg.tb if cfg.ring else 1, num_warps=cfg.num_warps))
    args = (xqb, xsb, w, h, s, y, partials, counters, m, p.n, trips, _share(trips, cfg.splits),
            w.stride(0), h.stride(0), s.stride(0), y.stride(0))
    meta = dict(FMT=p.fmt, TB=cfg.tb, R=R, SPLITS=cfg.splits, RED=TC.red_rows(cfg.num_warps, mt), MT=mt,
                PDL=pdl.get("PDL", False), LATE=TC.late_trigger(), ASM=c["ASM"], CONSTR=c["CONSTR"], L5=c["L5"],
                LB4=c["LB4"], LH3=c["LH3"], LRED=c["LRED"], MMA=c["MMA"], A_L=c["A_L"], B_L=c["B_L"],
                num_warps=cfg.num_warps, **({"launch_pdl": True} if pdl and x2.is_cuda else {}))
    if cfg.ring:
        _gemv_tkw_ring_kernel[(-(-p.n // R), cfg.splits)](
            *args, NS=cfg.ring, LCW=c["LCW"], LCS=c["LCS"], LCH=c["LCH"], SH3=c["SH3"], SH1=c["SH1"],
            LCX=_x_copy_layout(cfg.num_warps), SH4=c["SH4"], XSR=xs_in_ring(),
            LXS=gl.BlockedLayout([1], [32], [cfg.num_warps], [0]), **meta)
    else:
        _gemv_tkw_kernel[(-(-p.n // R), cfg.splits)](*args, PF=cfg.pf, PIN=bool(cfg.pin), **meta)
    return y
