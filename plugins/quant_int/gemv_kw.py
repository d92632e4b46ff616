"""Dequantize + GEMV walking K, for decode (M = 1..4 activation rows): gemv_h2's decode and f16x2
dot, with the walk turned around.

Why (BENCHMARKS.md, fourteenth run): gemv_h2 gives each CTA one K slice and streams rows through
it. With its decode and multiply-adds ablated it still moves the 27B's projections at only 52-60%
of the copy bandwidth, where a read of the same bytes along the same tile walk reaches 84%. What
the ablation keeps is the structure around the walk: every CTA prepares x for its slice (a max
over the slice: loads, a cross-warp reduction, barriers) before its few trips (about 7 on q5 down),
every trip ends in a cross-lane sum and a partial store per row, and the last CTA of a row chunk
sums the slices serially.

How: a CTA owns BLOCK_N rows and walks their K (or a 1/SPLITS share of it) BW words a trip, the
next trip's words loaded during this one's math. A trip's tile is [BW words, BLOCK_N rows],
words-first like gemv_h2's (each thread a run of four words, 16 B a load; with BW = 128 a warp
reads 512 contiguous bytes of one row). Each thread adds its runs' partials to an fp32
accumulator of the tile's shape; the only cross-lane sum is the CTA's last, once per row. x comes
prepared: `xpairs` (one small launch) writes, per K block of 128 and x row, the f16x2 pairs the
decode multiplies (scaled by a power of two from the block's max |x|, as gemv_h2 scales a slice)
and, per word column, 1/scale for the x row whose partial that column's lane carries (lane m of a
run is row m's). A trip then costs per thread its weight loads, 4 x loads a row of x (L1/L2 hits:
x is K x 2 bytes), the decode and dot (gemv_h2's PTX, shared: `_dot_out`), and one FFMA per word
and row into the accumulator. No prologue before the first trip's math, no per-trip stores;
SPLITS > 1 (only where rows are too few to fill the GPU) writes one partial per row and split,
summed by the last split to arrive as gemv_h2 does.

Under TRITON_INTERPRET=1 the same tiles and prepared pairs run through gemv_h2's plain integer
decode (x unpacked from the pairs, its factor and scale undone), so CI checks the walk, the
columns, the splits and the preparation; the PTX is gemv_h2's, checked in its emulator tests; and
the fast path itself runs on the CPU with `_dot_out` replaced by an emulation of its contract
(test_gemv_kw.py, EMULATED_DOT), so its operands, accumulator and reduction are checked too.

Static counts (sm_90, Triton 3.6, bench/h2_sass.py --kw): 2.43 SASS instructions a weight for q4
at M = 1 with the ping-pong walk (prefetch=2), 3.49 for q5, against gemv_h2's 3.08 and 4.21.
Timed on an H100 (BENCHMARKS.md, seventeenth run): at M = 1 q4 gate+up 85% of copy (gemv_h2 60%),
q5 70-75% (55-61%), the q6 head at a read-only stream's rate; the 27B step +23% with it on every
M <= 4 launch. Its measured winners (tuned.TUNED_KW) are dispatched by default (NINFER_KW=0 turns
them off; NINFER_KW=1 also sends every other launch it fits to default_config).
Known costs: x's pairs are a launch of their own (~2 µs before the GEMV can read x; written by
the kernels that produce x, they would not be), and each trip re-reads x's pairs from L1/L2
(16 B a word and x row, against 64 B of weights a word column at BLOCK_N = 16).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.kernels.epoch import epoch
from ninfer.kernels.triton import prefetch as PF
from ninfer.kernels.triton import sync as SY
from ninfer.kernels.triton.launch import interpreting, lasting, pdl_kwargs, pdl_prologue
from ninfer.kernels.triton.norms import rmsnorm_row
from ninfer.kernels.triton.sync import wait_at_least
from ninfer_plugins.quant_int import gemv_h2 as H2
from ninfer_plugins.quant_int import kernels as QK

MAX_M = 4
# tests only: the interpreter runs the fast path, with gemv_h2._dot_out replaced by an emulation
EMULATED_DOT = False
DECODES = H2.DECODES
NVFP4 = H2.NVFP4
WORDS = H2.WORDS  # 32-bit words of packed codes per K block of 128 elements


@dataclass(frozen=True)
class KWConfig:
    block_n: int = 16  # rows a CTA
    bw: int = 128  # words of each row a trip (a multiple of the format's words a K block)
    splits: int = 1  # K shares, summed by the last to arrive (rows too few to fill the GPU)
    num_warps: int = 4
    prefetch: int = 1  # 1: the next trip's words load during this trip's math; 2: the same, two trips an iteration (ping-pong, no register copies)
    inline: bool = False  # x's pairs made by the GEMV's first CTAs (the others wait on a count), not a launch of their own
    # a warp barrier after the next trip's loads, which ptxas then cannot sink below this trip's
    # math (the sm_90 SASS of pf/pp has them issued two thirds into the trip or at its end)
    pin: bool = False
    # the grid's last `tail` row blocks walk K in `tail_splits` shares of whole trips (summed by the
    # last to arrive), the others whole: a grid of 4.12 waves (q4 gate+up at BN16, 4 CTAs an SM,
    # bench/occupancy.py) may leave its last 64 CTAs walking alone on an idle GPU; in 2 shares (its
    # 5 trips of BW 128 as 3 + 2) they take 3/5 of a walk. 0: off (an experiment, not yet timed:
    # bench/wave_tail.py first). Only with splits = 1 and x's pairs from their own launch.
    tail: int = 0
    tail_splits: int = 0

    def describe(self) -> str:
        return (f"KW BN{self.block_n} BW{self.bw} S{self.splits} w{self.num_warps}" + ("", " pf", " pp")[int(self.prefetch)]
                + (" inline" if self.inline else "") + (" pin" if self.pin else "")
                + (f" T{self.tail}x{self.tail_splits}" if self.tail else ""))

    def workspace(self, p: QK.Prepared) -> tuple[int, int]:
        return workspace_need(p, self)

    def run(self, x2: torch.Tensor, p: QK.Prepared, fast: bool | None = None) -> torch.Tensor:
        return launch(x2, p, self, fast)


def row_words(fmt: int, k: int) -> int:
    return k // 128 * WORDS[fmt]


def supports(p: QK.Prepared, cfg: KWConfig) -> bool:
    return _fits(p.fmt, p.k, cfg)


def _fits(fmt: int, k: int, cfg: KWConfig) -> bool:
    if fmt not in DECODES or k % 128 or cfg.bw % WORDS[fmt] or QK.ROW_PAD % cfg.block_n:
        return False
    # every thread a whole run of four words (fewer and Triton would pad the asm's pack of 4)
    if cfg.bw * cfg.block_n < 4 * 32 * cfg.num_warps or cfg.bw % 4:
        return False
    if row_words(fmt, k) % cfg.bw:
        return False
    # K shares of whole trips, ragged where the trips do not divide (q5 down's 17 trips in two:
    # 9 and 8): every share gets at least one
    if cfg.tail or cfg.tail_splits:
        ts = cfg.tail_splits
        if cfg.tail < 1 or ts < 2 or ts & (ts - 1) or cfg.splits != 1 or cfg.inline:
            return False
        if not _shares_fit(row_words(fmt, k) // cfg.bw, ts):
            return False
    return _shares_fit(row_words(fmt, k) // cfg.bw, cfg.splits)


def _share(trips: int, splits: int) -> int:
    """Trips a K share walks (the last share walks what is left)."""
    return -(-trips // splits)


def _shares_fit(trips: int, splits: int) -> bool:
    """Whether `splits` shares of _share(trips, splits) trips leave the last share at least one
    (gemv_tkw's shares follow the same rule)."""
    return (splits - 1) * _share(trips, splits) < trips


def enabled() -> bool:
    """NINFER_KW=1 sends every M <= 4 decode launch it fits to this kernel (kernels.pick_gemv),
    its measured winner (tuned.TUNED_KW) where there is one, else default_config (read at each
    launch, so an A/B may switch it between runs of one process)."""
    return os.environ.get("NINFER_KW", "") == "1"


def tuned_allowed() -> bool:
    """The measured winners of tuned.TUNED_KW are dispatched unless NINFER_KW=0."""
    return os.environ.get("NINFER_KW", "") != "0"


def default_config(fmt: int, n: int, k: int, sm_count: int) -> KWConfig | None:
    """16 rows a CTA, 4 warps, the widest trip that divides a row's words (128, 64 or 32), and K
    shares (2, then 4) only while the row blocks alone give fewer than two CTAs an SM."""
    for bw in (128, 64, 32):
        best = None
        for splits in (1, 2, 4):
            cfg = KWConfig(16, bw, splits)
            if not _fits(fmt, k, cfg):
                break
            best = cfg
            if -(-n // cfg.block_n) * splits >= 2 * sm_count:
                break
        if best is not None:
            return best
    return None


def workspace_need(p: QK.Prepared, cfg: KWConfig) -> tuple[int, int]:
    """(partials, counters): one fp32 a row, split (or tail share) and x row; one counter a row block."""
    shares = cfg.tail_splits if cfg.tail else cfg.splits
    if shares == 1:
        return 0, 0
    return shares * MAX_M * p.n, -(-p.n // cfg.block_n)


# --- x, prepared once a launch ---------------------------------------------------------------------


@triton.jit
def _xpairs_item(X, XP, INV, INVM, M, KW, NKB, stride_xm, GOFF, m, kb,
                 FMT: tl.constexpr, HEAD: tl.constexpr, ASM_PAIRS: tl.constexpr, GATED: tl.constexpr):
    """Row m of x over K block kb -> per word column c of the block, the f16x2 pairs A, B, C, D
    (XP [4 rows][4 parts][KW words]); INVM [4, NKB]: 1/scale of (m, kb); INV [KW]: the 1/scale the
    fast path applies to word c's output lane, i.e. row c % 4's (with NVFP4's 2^22). Rows m >= M
    are zeros. ASM_PAIRS: the fp32 -> f16x2 conversions in PTX (else plain Triton, same rounding)."""
    _xpairs_blocks(X, XP, INV, INVM, M, KW, NKB, stride_xm, GOFF, m, kb + tl.zeros([1, 1], tl.int32),
                   FMT, HEAD, ASM_PAIRS, GATED)


@triton.jit
def _xpairs_blocks(X, XP, INV, INVM, M, KW, NKB, stride_xm, GOFF, m, kb,
                   FMT: tl.constexpr, HEAD: tl.constexpr, ASM_PAIRS: tl.constexpr, GATED: tl.constexpr):
    """_xpairs_item for the K blocks kb [R, 1] at once, each scaled on its own; blocks kb >= NKB
    (a power-of-two tile's padding) store nothing."""
    WPB: tl.constexpr = 32 if FMT == 8 else 16
    t = tl.arange(0, WPB)[None, :]
    ok = (kb < NKB) & (t >= 0)
    kbc = tl.minimum(kb, NKB - 1)
    if FMT == 16:
        base = kbc * 128 + (t // 2) * 16 + (t % 2) * 4
    else:
        base = kbc * 128 + t * 4
    l0, l1, l2, l3, h0, h1, h2, h3, e, f, fb, fc, fd = H2._x_scaled(X, m, stride_xm, M, base, FMT, HEAD, GOFF, GATED,
                                                                    True)
    inv = H2._pow2(-e)
    inv_fast = H2._pow2(22 - e) if FMT == 16 else inv  # NVFP4: the decode's 2^-22 undone with the scaling
    col = kbc * WPB + t
    xp = XP + m * 4 * KW + col
    tl.store(xp, H2._pair(l0 * f, l2 * f, ASM_PAIRS), mask=ok)
    tl.store(xp + KW, H2._pair(h0 * fb, h2 * fb, ASM_PAIRS), mask=ok)
    tl.store(xp + 2 * KW, H2._pair(l1 * fc, l3 * fc, ASM_PAIRS), mask=ok)
    tl.store(xp + 3 * KW, H2._pair(h1 * fd, h3 * fd, ASM_PAIRS), mask=ok)
    tl.store(INV + col, tl.broadcast_to(inv_fast, col.shape), mask=ok & ((t % 4) == m))
    tl.store(INVM + m * NKB + kbc, inv, mask=kb < NKB)


@triton.jit
def _xpairs_kernel(X, XP, INV, INVM, M, KW, NKB, stride_xm, GOFF,
                   FMT: tl.constexpr, HEAD: tl.constexpr, FAST: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr = False):
    """Program (m, kb): _xpairs_item."""
    m = tl.program_id(0)
    kb = tl.program_id(1)
    pdl_prologue(PDL)
    _xpairs_item(X, XP, INV, INVM, M, KW, NKB, stride_xm, GOFF, m, kb, FMT, HEAD, FAST, GATED)


def x_scratch(device: torch.device, fmt: int, k: int) -> tuple[torch.Tensor, ...]:
    """(XP, INV, INVM) kept per (device, format, K) for the life of the process (a CUDA graph
    reuses the pointers); made on first use, which must not be inside a capture: reserve_workspace
    asks for it at load."""
    kw = row_words(fmt, k)
    nkb = k // 128

    def make():
        return (torch.zeros(MAX_M * 4 * kw, dtype=torch.int32, device=device),
                torch.zeros(kw, dtype=torch.float32, device=device),
                torch.zeros(MAX_M * nkb, dtype=torch.float32, device=device))

    return lasting("gemv_kw_x", device, (fmt, k), make)


def ready_counters(device: torch.device) -> torch.Tensor:
    """int32 [2] (pairs made, CTAs finished) of the inline x pairs, zero between launches (the
    last CTA puts them back); one pair a device: launches run one at a time on one stream."""
    return lasting("gemv_kw_ready", device, (), lambda: torch.zeros(2, dtype=torch.int32, device=device))


def pairs_of(x2: torch.Tensor, fmt: int, k: int, block_m: int, fast: bool, gated: bool = False) -> tuple[torch.Tensor, ...]:
    """x2's (XP, INV, INVM) for a GEMV launch: x_scratch as it is where it holds them already (the
    norm or the kernel that made x2 wrote them, or a launch before on the same x2; see reuse_inputs),
    else made by `xpairs`."""
    if reuse_inputs() and holds_input(_pairs_key(x2.device, fmt, k), x2, (block_m, gated)):
        return x_scratch(x2.device, fmt, k)
    return xpairs(x2, fmt, k, block_m, fast, gated)


def xpairs(x2: torch.Tensor, fmt: int, k: int, block_m: int, fast: bool, gated: bool = False) -> tuple[torch.Tensor, ...]:
    """x2 [M, k] (gated: [M, 2k], silu(gate) * up) -> (XP, INV, INVM) for _gemv_kw_kernel, in
    x_scratch."""
    kw = row_words(fmt, k)
    nkb = k // 128
    xp, inv, invm = x_scratch(x2.device, fmt, k)
    _xpairs_kernel[(block_m, nkb)](
        x2, xp, inv, invm, x2.shape[0], kw, nkb, x2.stride(0), k if gated else 0,
        FMT=fmt, HEAD=H2.HEAD[fmt], FAST=fast, GATED=gated, num_warps=1, **pdl_kwargs(x2.device, scoped=False),
    )
    if reuse_inputs():
        note_input(_pairs_key(x2.device, fmt, k), x2, (block_m, gated))
    return xp, inv, invm


# --- x's pairs made once an x (NINFER_NORM_PAIRS, the default, or NINFER_KW_XREUSE=1) --------------
#
# x_scratch remembers whose pairs it holds: a K-walk launch on that same
# x (the tensor or a view of it, unchanged since: its version counter), rows and format skips its
# x-pairs launch, and the norm that makes a K-walk GEMV's input writes them in its own launch
# (`norm_pairs`, through QLinear.norm_input). Each removes one launch from the step's chain of
# dependent kernels (x's pairs alone: 0.9-1.3 us on an H100, BENCHMARKS.md seventeenth run): the
# 27B's input and post-mixer norms feed K-walk GEMVs (qkv+z, q+v, gate+up) in 129 places a step,
# the head included; the 35B's in 41. The tensor-core K-walk's prepared x (gemv_tkw.xq, the MTP
# verify's M = 4 launches) is kept the same way. Whether a launch skips is decided on the host,
# once, so a CUDA graph captures the launches that ran.

# scratch key (kind, device, ...) -> what that scratch holds: (weakref to the x tensor the note was
# made on, its storage's identity, data_ptr, shape, strides, dtype, version (None for an inference
# tensor, which keeps none), the note's epoch (ninfer.kernels.epoch), tag: what else the contents
# depend on)
_HELD: dict[tuple, tuple] = {}


def xreuse() -> bool:
    """NINFER_KW_XREUSE=1, or NINFER_NORM_PAIRS on (the default: the spread norm's pairs, reused the
    same way; =0 turns both off unless NINFER_KW_XREUSE=1)."""
    return os.environ.get("NINFER_KW_XREUSE", "0") == "1" or norm_spread()


def norm_spread() -> bool:
    """The norm before a K-walk or CUDA GEMV makes its pairs, spread over its K blocks
    (norm_pairs_spread; QLinear.norm_input), and the GDN decode step out_proj's: on by default
    (H200: the 35B int4 step 1.943 -> 1.890 ms, the 27B's 6.55 -> 6.51; BENCHMARKS.md thirty-ninth
    run); NINFER_NORM_PAIRS=0 turns it off."""
    return os.environ.get("NINFER_NORM_PAIRS", "1") != "0"


def reuse_inputs() -> bool:
    """xreuse(), forgetting what the scratch holds when off (launches then make pairs unnoted)."""
    if xreuse():
        return True
    _HELD.clear()
    return False


def _pairs_key(device: torch.device, fmt: int, k: int) -> tuple:
    return ("kw", str(device), fmt, k)


def _version(t: torch.Tensor) -> int | None:
    # an inference tensor (made under torch.inference_mode, as the engine's steps are) keeps no
    # version counter: in-place writes to it go unnoticed, and the model never writes the output
    # of a norm or a projection in place
    return None if t.is_inference() else t._version


def _record(x2: torch.Tensor) -> tuple:
    return (x2.untyped_storage()._cdata, x2.data_ptr(), tuple(x2.shape), tuple(x2.stride()), x2.dtype, _version(x2))


def note_input(key: tuple, x2: torch.Tensor, tag: tuple) -> None:
    """The scratch `key` now holds what was made from x2 (as it is now) and `tag`."""
    _HELD[key] = (weakref.ref(x2), _record(x2), epoch(), tag)


def holds_input(key: tuple, x2: torch.Tensor, tag: tuple) -> bool:
    """Whether the scratch `key` holds what was made from x2 as it is now: the noted tensor or a
    view of it (while the noted tensor lives, its storage's identity is its own), at the same
    place with the same shape, strides and dtype, not written since (where torch counts writes),
    in the same epoch (no capture or replay since), with the same `tag`."""
    held = _HELD.get(key)
    if held is None:
        return False
    ref, record, when, was = held
    return ref() is not None and when == epoch() and was == tag and _record(x2) == record


@triton.jit
def _norm_pairs_kernel(X, RES, W, Y, XP, INV, INVM, sx, sr, sy, n_cols, eps, KW, NKB,
                       BLOCK: tl.constexpr, HAS_RES: tl.constexpr, NKB_P2: tl.constexpr, FMT: tl.constexpr,
                       HEAD: tl.constexpr, ASM_PAIRS: tl.constexpr, PDL: tl.constexpr = False):
    """Row m: norms.rmsnorm's (1 + w) RMSNorm (after residual += x with HAS_RES) into Y, then the
    K-walk GEMV's pairs of that row over all its K blocks at once, read back from Y as xpairs
    reads x (a barrier between: this CTA's own stores)."""
    pdl_prologue(PDL)
    m = tl.program_id(0)
    rmsnorm_row(X, RES, W, Y, m.to(tl.int64), sx, sr, sy, n_cols, eps, BLOCK, True, HAS_RES)
    tl.debug_barrier()
    _xpairs_blocks(Y, XP, INV, INVM, tl.num_programs(0), KW, NKB, sy, 0, m, tl.arange(0, NKB_P2)[:, None],
                   FMT, HEAD, ASM_PAIRS, False)


def _norm_pairs_checked(x: torch.Tensor, residual: torch.Tensor | None, fmt: int) -> torch.Tensor:
    """What the norms that write pairs take (1, 2 or 4 rows of a multiple of 128, a K-walk format,
    unit last strides, a residual of x's shape): the tensor the residual add reads (x without one)."""
    n, k = x.shape
    if n not in (1, 2, 4) or k % 128 or fmt not in DECODES:
        raise ValueError(f"norm_pairs takes 1, 2 or 4 rows of a multiple of 128 in a K-walk format, got {n} x {k}, format {fmt}")
    res = residual if residual is not None else x
    if x.stride(1) != 1 or res.stride(1) != 1 or (residual is not None and residual.shape != x.shape):
        raise ValueError("norm_pairs needs unit last strides and a residual of x's shape")
    return res


def norm_pairs(x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: int, residual: torch.Tensor | None = None,
               fast: bool = True) -> torch.Tensor:
    """norms.rmsnorm(x, weight, eps, residual=residual) (the Qwen (1 + w) form; residual += x in
    place first, when given) and, in the same launch, the K-walk GEMV's x pairs of the result for
    a weight of format `fmt` with K = the row width, noted so that the GEMV on the result skips
    its own x-pairs launch. x [N, K] with N = 1, 2 or 4 (the GEMV's row blocks), K a multiple of 128."""
    n, k = x.shape
    res = _norm_pairs_checked(x, residual, fmt)
    out = torch.empty(n, k, dtype=x.dtype, device=x.device)
    xp, inv, invm = x_scratch(x.device, fmt, k)
    block = triton.next_power_of_2(k)
    nkb = k // 128
    _norm_pairs_kernel[(n,)](
        x, res, weight, out, xp, inv, invm, x.stride(0), res.stride(0), out.stride(0), k, eps, row_words(fmt, k), nkb,
        BLOCK=block, HAS_RES=residual is not None, NKB_P2=triton.next_power_of_2(nkb), FMT=fmt, HEAD=H2.HEAD[fmt],
        ASM_PAIRS=fast and not interpreting(), num_warps=min(16, max(1, block // 512)), **pdl_kwargs(x.device),
    )
    if reuse_inputs():
        note_input(_pairs_key(out.device, fmt, k), out, (n, False))
    return out


# --- the norm and x's pairs spread over the K blocks (default; NINFER_NORM_PAIRS=0 turns it off) ------
#
# norm_pairs makes a row's pairs in one CTA, after its norm: the step waits for that serial tail,
# and the 27B step got 0.28 ms slower with it (BENCHMARKS.md, twenty-third run). Here the row is
# spread: program (m, j) loads the whole row and reduces it exactly as rmsnorm_row does (each
# program alike, so each gets the same 1/rms), then stores only its own K blocks of the norm and
# their pairs. The residual sum goes to a new tensor, not in place: every program reads the old
# residual whole, and a program writing its blocks back could race another still reading them.


@triton.jit
def _norm_pairs_spread_kernel(X, RES, RES_OUT, W, Y, XP, INV, INVM, sx, sr, so, sy, n_cols, eps, KW, NKB,
                              BLOCK: tl.constexpr, HAS_RES: tl.constexpr, KB_PER: tl.constexpr, FMT: tl.constexpr,
                              HEAD: tl.constexpr, ASM_PAIRS: tl.constexpr, PDL: tl.constexpr = False):
    """Program (m, j): row m's rmsnorm_row (after s = RES + X, rounded to RES's dtype, when
    HAS_RES), storing only the columns of K blocks j * KB_PER .. (j + 1) * KB_PER - 1 of s (into
    RES_OUT) and of the norm (into Y); then those blocks' pairs, read back from Y as xpairs reads
    x (a barrier between: this CTA's own stores)."""
    pdl_prologue(PDL)
    m = tl.program_id(0)
    j = tl.program_id(1)
    rmsnorm_row(X, RES, W, Y, m.to(tl.int64), sx, sr, sy, n_cols, eps, BLOCK, True, HAS_RES, RES_OUT, so,
                j * (KB_PER * 128), KB_PER * 128)
    tl.debug_barrier()
    _xpairs_blocks(Y, XP, INV, INVM, tl.num_programs(0), KW, NKB, sy, 0, m, j * KB_PER + tl.arange(0, KB_PER)[:, None],
                   FMT, HEAD, ASM_PAIRS, False)


def norm_pairs_spread(x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: int,
                      residual: torch.Tensor | None = None, fast: bool = True,
                      kb_per: int = 1) -> tuple[torch.Tensor | None, torch.Tensor]:
    """norm_pairs in (rows x K blocks / kb_per) programs: -> (s, h), s = residual + x (rounded to
    the residual's dtype) in a new tensor (None without a residual; `residual` itself is not
    written), h its (1 + w) RMSNorm, both equal to the bit to norms.rmsnorm's; the K-walk GEMV's
    x pairs of h in x_scratch, noted (as norm_pairs)."""
    n, k = x.shape
    res = _norm_pairs_checked(x, residual, fmt)
    if kb_per < 1 or kb_per & (kb_per - 1):
        raise ValueError(f"norm_pairs_spread's K blocks a program must be a power of two, got {kb_per}")
    out = torch.empty(n, k, dtype=x.dtype, device=x.device)
    s = torch.empty(n, k, dtype=res.dtype, device=x.device) if residual is not None else None
    xp, inv, invm = x_scratch(x.device, fmt, k)
    block = triton.next_power_of_2(k)
    nkb = k // 128
    res_out = s if s is not None else out
    _norm_pairs_spread_kernel[(n, triton.cdiv(nkb, kb_per))](
        x, res, res_out, weight, out, xp, inv, invm, x.stride(0), res.stride(0), res_out.stride(0), out.stride(0), k,
        eps, row_words(fmt, k), nkb,
        BLOCK=block, HAS_RES=residual is not None, KB_PER=kb_per, FMT=fmt, HEAD=H2.HEAD[fmt],
        ASM_PAIRS=fast and not interpreting(), num_warps=min(16, max(1, block // 512)), **pdl_kwargs(x.device),
    )
    if reuse_inputs():
        note_input(_pairs_key(out.device, fmt, k), out, (n, False))
    return s, out


# --- the GEMV ------------------------------------------------------------------------------------


@triton.jit
def _half(pair, hi: tl.constexpr):
    """Interpreter path: one f16 of an f16x2 int32 pair, as fp32."""
    if hi:
        v = (pair >> 16) & 0xFFFF
    else:
        v = pair & 0xFFFF
    return v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _plain_trip(w, hl, hh, s, jj, cols, XP, INVM, KW, NKB, cols4, acc,
                FMT: tl.constexpr, BLOCK_M: tl.constexpr):
    """Interpreter path: the tile's sums for every x row added to acc [4, BLOCK_N], x unpacked
    from the prepared pairs with the decode's factors (gemv_h2.X_FACTORS) and the scaling undone."""
    WPB: tl.constexpr = 32 if FMT == 8 else 16
    cols = tl.max(cols, 1)
    s_lo, s_hi = H2._plain_scales(s, jj, FMT)
    if FMT == 16 or FMT == 8:
        fb = 1.0
        fc = 1.0
        fd = 1.0
    elif FMT == 5:
        fb = 16.0
        fc = 2.0
        fd = 32.0
    else:
        fb = 16.0
        fc = 1.0
        fd = 16.0
    for mm in tl.static_range(BLOCK_M):
        xp = XP + mm * 4 * KW + cols
        a = tl.load(xp)
        b = tl.load(xp + KW)
        c = tl.load(xp + 2 * KW)
        d = tl.load(xp + 3 * KW)
        im = tl.load(INVM + mm * NKB + cols // WPB)
        r = H2._plain_row(w, hl, hh, jj, s_lo, s_hi,
                          _half(a, False) * im, _half(c, False) * fc * im, _half(a, True) * im, _half(c, True) * fc * im,
                          _half(b, False) * fb * im, _half(d, False) * fd * im, _half(b, True) * fb * im, _half(d, True) * fd * im,
                          FMT)
        acc += tl.where(cols4 == mm, r[None, :], 0.0)
    return acc


@triton.jit
def _x_operands(XP, cols, KW, m: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row m's four pair vectors [BW, 1] of this trip (row 0's again past BLOCK_M: never used),
    loaded as columns so that they take the word tile's layout (a [BW] load is laid out on its
    own, one word a thread across the warps, and costs a shared-memory shuffle a trip)."""
    mm: tl.constexpr = m if m < BLOCK_M else 0
    xp = XP + mm * 4 * KW + cols
    return tl.load(xp), tl.load(xp + KW), tl.load(xp + 2 * KW), tl.load(xp + 3 * KW)


@triton.jit
def _kw_math(acc, w, hl, hh, s, h_shift, jj, cols, XP, INV, INVM, KW, NKB, cols4,
             FMT: tl.constexpr, BLOCK_M: tl.constexpr, ASM: tl.constexpr, CONSTR: tl.constexpr, FAST: tl.constexpr,
             ABLATE: tl.constexpr):
    """One trip's words into the accumulator: fast, acc [BW, BLOCK_N] += each run's partials
    (lane m: x row m's) times 1/x's scale; plain (interpreter), acc [4, BLOCK_N] += the rows' sums."""
    if FAST and ABLATE == 1:
        # a measurement (bench/kw_bench.py), never dispatched: the walk, x's loads (row 0's only:
        # at M = 4 it understates them) and the accumulator, one xor a word in place of the
        # decode and multiply-adds
        xa0, xb0, xc0, xd0 = _x_operands(XP, cols, KW, 0, BLOCK_M)
        fold = w ^ hl ^ hh ^ s.to(tl.int32) ^ xa0 ^ xb0 ^ xc0 ^ xd0
        acc += fold.to(tl.float32, bitcast=True) * tl.load(INV + cols)
    elif FAST:
        xa0, xb0, xc0, xd0 = _x_operands(XP, cols, KW, 0, BLOCK_M)
        xa1, xb1, xc1, xd1 = _x_operands(XP, cols, KW, 1, BLOCK_M)
        xa2, xb2, xc2, xd2 = _x_operands(XP, cols, KW, 2, BLOCK_M)
        xa3, xb3, xc3, xd3 = _x_operands(XP, cols, KW, 3, BLOCK_M)
        out = H2._dot_out(w, hl, hh, s, h_shift, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1, xa2, xb2, xc2, xd2,
                          xa3, xb3, xc3, xd3, FMT, BLOCK_M, ASM, CONSTR)
        acc += out * tl.load(INV + cols)
    else:
        acc = _plain_trip(w, hl, hh, s, jj, cols, XP, INVM, KW, NKB, cols4, acc, FMT, BLOCK_M)
    return acc


@triton.jit
def _l2_ahead(W, H, S, rows, it0, n_it, stride_wn, stride_hn, stride_sn, FMT: tl.constexpr, BW: tl.constexpr,
              GSTEP: tl.constexpr, HSTEP: tl.constexpr, L2PF: tl.constexpr, ASM: tl.constexpr):
    """Trips 2..L2PF+1 of this CTA's share asked of the L2 (ninfer.kernels.triton.prefetch): a row's
    words of a trip are BW x 4 bytes (one prefetch a 128-byte line), its q5/q6 bit words and its
    scales a line or two."""
    LW: tl.constexpr = PF.pow2_lines(BW * 4)
    r64 = rows.to(tl.int64)[None, :]
    wl = W + r64 * stride_wn + (it0 * BW + tl.arange(0, LW)[:, None] * 32)
    sl = S + r64 * stride_sn + it0 * GSTEP
    if FMT == 5 or FMT == 6:
        LH: tl.constexpr = PF.pow2_lines(HSTEP * 4)
        hl = H + r64 * stride_hn + (it0 * HSTEP + tl.arange(0, LH)[:, None] * 32)
    for t in range(1, tl.minimum(n_it, L2PF + 1)):
        PF.l2_prefetch(wl + t * BW, ASM)
        PF.l2_prefetch(sl + t * GSTEP, ASM)
        if FMT == 5 or FMT == 6:
            PF.l2_prefetch(hl + t * HSTEP, ASM)


@triton.jit(do_not_specialize=["M", "N", "ITERS", "TRIPS", "MAIN", "ITERS_T"])
def _gemv_kw_kernel(
    XP, INV, INVM, W, H, S, Y, WS, CNT, G, X, RDY,
    M, N, KW, NKB, ITERS, TRIPS, stride_xm, GOFF, PRODUCERS,
    stride_wn, stride_hn, stride_sn, stride_ym,
    MAIN, ITERS_T,
    FMT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BW: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ASM: tl.constexpr,
    CONSTR: tl.constexpr,
    FAST: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr = False,
    ABLATE: tl.constexpr = 0,
    INLINE: tl.constexpr = False,
    HEAD: tl.constexpr = 0,
    GATED: tl.constexpr = False,
    ASM_PAIRS: tl.constexpr = False,
    L2PF: tl.constexpr = 0,
    PIN: tl.constexpr = False,
    TAIL_S: tl.constexpr = 0,
):
    pid_r = tl.program_id(0)
    pid_s = tl.program_id(1)
    iters = ITERS
    tl.static_assert(not (INLINE and TAIL_S > 0), "x's pairs made inline need the grid's own ids: no tail")
    if TAIL_S > 0:
        # a 1-D grid: programs 0..MAIN-1 walk row blocks 0..MAIN-1 whole; the rest walk the tail's
        # row blocks in TAIL_S shares of ITERS_T trips each (launched last, they fill the last wave)
        t = tl.maximum(pid_r - MAIN, 0)
        in_tail = pid_r >= MAIN
        pid_s = tl.where(in_tail, t % TAIL_S, 0)
        pid_r = tl.where(in_tail, MAIN + t // TAIL_S, pid_r)
        iters = tl.where(in_tail, ITERS_T, TRIPS)
    WPB: tl.constexpr = 32 if FMT == 8 else 16
    KBS: tl.constexpr = BW // WPB  # K blocks a trip
    # a trip's columns, relative to the trip (gemv_h2's slice columns for slice 0 of KBS blocks),
    # and how far each pointer moves a trip
    w_cols, g_cols, h_cols, h_shift, lead, jj, base = H2.slice_columns(0, FMT, KBS)
    GSTEP: tl.constexpr = 4 * KBS if (FMT == 8 or FMT == 16) else KBS
    HSTEP: tl.constexpr = 4 * KBS if FMT == 5 else 8 * KBS
    rn = tl.arange(0, BLOCK_N)
    rows = pid_r * BLOCK_N + rn  # rows are padded to ROW_PAD, a multiple of BLOCK_N: loads need no mask
    it0 = pid_s * iters
    # this share's trips: ITERS, or what is left for the last share of a ragged split (>= 1: _fits)
    n_it = tl.minimum(iters, TRIPS - it0)
    r64 = rows.to(tl.int64)[None, :]
    wp = W + r64 * stride_wn + (w_cols[:, None] + it0 * BW)
    sp = S + r64 * stride_sn + (g_cols[:, None] + it0 * GSTEP)
    hp = H + r64 * stride_hn + (h_cols[:, None] + it0 * HSTEP)
    cols = it0 * BW + tl.arange(0, BW)[:, None] + rn[None, :] * 0  # [BW, BLOCK_N]: the word tile's layout
    cols4 = tl.arange(0, 4)[:, None]
    if PREFETCH != 0:
        # the first trip's words do not depend on the kernel before: requested before waiting on it
        w_n, hl_n, hh_n, s_n = H2._load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
    if L2PF > 0:
        _l2_ahead(W, H, S, rows, it0, n_it, stride_wn, stride_hn, stride_sn, FMT, BW, GSTEP, HSTEP, L2PF, ASM_PAIRS)
    pdl_prologue(PDL)
    if INLINE:
        # x's pairs made by this launch (no launch of their own): the first PRODUCERS CTAs in
        # launch order make BLOCK_M x NKB (row, K block) items between them and release a count;
        # every CTA waits for the count before its first read of x. The producers never wait
        # before producing and are dispatched first, so the wait ends. The last CTA to finish
        # puts both counters back to 0 for the next launch (whose producers first wait, through
        # PDL, for this grid to finish).
        lin = pid_s * tl.num_programs(0) + pid_r
        if lin < PRODUCERS:
            for item in range(lin, BLOCK_M * NKB, PRODUCERS):
                _xpairs_item(X, XP, INV, INVM, M, KW, NKB, stride_xm, GOFF, item // NKB, item % NKB,
                             FMT, HEAD, ASM_PAIRS, GATED)
            tl.debug_barrier()
            tl.atomic_add(RDY, 1, sem="release")
        # (without ASM_PAIRS, the interpreter: one producer, run first)
        wait_at_least(RDY, PRODUCERS, ASM_PAIRS)
    if FAST:
        acc = tl.zeros([BW, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([4, BLOCK_N], dtype=tl.float32)
    if PREFETCH == 2:
        # two trips an iteration, ping-pong: the next trip's words load into the registers the
        # last one freed (no copies); an odd trip count loads the last trip twice, adds it once
        for i in range(0, n_it, 2):
            d1 = tl.where(i + 1 < n_it, 1, 0)
            w_b, hl_b, hh_b, s_b = H2._load_tile(wp + d1 * BW, sp + d1 * GSTEP, hp + d1 * HSTEP, h_shift, lead, FMT, FAST)
            H2._pin_loads(PIN and ASM_PAIRS)
            acc = _kw_math(acc, w_n, hl_n, hh_n, s_n, h_shift, jj, cols, XP, INV, INVM, KW, NKB, cols4,
                           FMT, BLOCK_M, ASM, CONSTR, FAST, ABLATE)
            d2 = tl.minimum(i + 2, n_it - 1) - i
            wp += d2 * BW
            sp += d2 * GSTEP
            hp += d2 * HSTEP
            w_n, hl_n, hh_n, s_n = H2._load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
            H2._pin_loads(PIN and ASM_PAIRS)
            if i + 1 < n_it:
                acc = _kw_math(acc, w_b, hl_b, hh_b, s_b, h_shift, jj, cols + BW, XP, INV, INVM, KW, NKB, cols4,
                               FMT, BLOCK_M, ASM, CONSTR, FAST, ABLATE)
            cols += 2 * BW
    else:
        for i in range(n_it):
            if PREFETCH == 1:
                w = w_n
                hl = hl_n
                hh = hh_n
                s = s_n
                # the next trip's words, or this trip's again after the last (stays in bounds)
                step = tl.where(i + 1 < n_it, 1, 0)
                wp += step * BW
                sp += step * GSTEP
                hp += step * HSTEP
                w_n, hl_n, hh_n, s_n = H2._load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
                H2._pin_loads(PIN and ASM_PAIRS)
            else:
                w, hl, hh, s = H2._load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
                wp += BW
                sp += GSTEP
                hp += HSTEP
            acc = _kw_math(acc, w, hl, hh, s, h_shift, jj, cols, XP, INV, INVM, KW, NKB, cols4,
                           FMT, BLOCK_M, ASM, CONSTR, FAST, ABLATE)
            cols += BW
    if FAST:
        # lane m of each run is x row m's: [BW // 4, 4, BLOCK_N] -> [4, BLOCK_N], the one cross-lane sum
        part = tl.sum(tl.reshape(acc, (BW // 4, 4, BLOCK_N)), 0)
    else:
        part = acc
    ok = rows < N
    if TAIL_S > 0:
        if pid_r < MAIN:
            _kw_out(part, rows, ok, cols4, pid_r, pid_s, Y, WS, CNT, G, M, stride_ym, FMT, 1, BLOCK_M)
        else:
            _kw_out(part, rows, ok, cols4, pid_r, pid_s, Y, WS, CNT, G, M, stride_ym, FMT, TAIL_S, BLOCK_M)
    else:
        _kw_out(part, rows, ok, cols4, pid_r, pid_s, Y, WS, CNT, G, M, stride_ym, FMT, SPLITS, BLOCK_M)
    if INLINE:
        tl.debug_barrier()
        done = tl.atomic_add(RDY + 1, 1, sem="acq_rel")
        if done == tl.num_programs(0) * tl.num_programs(1) - 1:
            tl.atomic_xchg(RDY, 0)
            tl.atomic_xchg(RDY + 1, 0)


@triton.jit
def _kw_out(part, rows, ok, cols4, pid_r, pid_s, Y, WS, CNT, G, M, stride_ym, FMT: tl.constexpr, SPLITS: tl.constexpr,
            BLOCK_M: tl.constexpr):
    """A CTA's [4, BLOCK_N] sums out: stored (one share), or one partial a row, share and x row, the
    last share of the row block to arrive summing them in share order (bit-reproducible) and
    resetting the counter."""
    if SPLITS == 1:
        if FMT == 16:
            part = part * tl.load(G + rows, mask=ok, other=0.0)[None, :]  # NVFP4's per-row global scale
        dst = Y + cols4 * stride_ym + rows[None, :]
        tl.store(dst, part.to(Y.dtype.element_ty), mask=ok[None, :] & (cols4 < M))
    else:
        tl.store(WS + (rows[None, :].to(tl.int64) * SPLITS + pid_s) * 4 + cols4, part, mask=ok[None, :] & (cols4 < BLOCK_M))
        tl.debug_barrier()
        arrived = SY.arrive(CNT + pid_r)
        if arrived == SPLITS - 1:
            SY.acquire_all(arrived)
            sl = tl.arange(0, SPLITS)[:, None]
            for mm in tl.static_range(BLOCK_M):
                p = tl.load(WS + (rows[None, :].to(tl.int64) * SPLITS + sl) * 4 + mm, mask=ok[None, :], other=0.0,
                            cache_modifier=".cg")
                y = tl.sum(p, 0)
                if FMT == 16:
                    y = y * tl.load(G + rows, mask=ok, other=0.0)
                tl.store(Y + mm * stride_ym + rows, y.to(Y.dtype.element_ty), mask=ok & ((rows * 0 + mm) < M))
            SY.rearm(CNT + pid_r)


def l2_ahead_trips(p: QK.Prepared, cfg: KWConfig, budget: int | None = None) -> int:
    """Trips a CTA asks the L2 for before waiting on the kernel before (prefetch.l2_trips): the
    budget (default NINFER_L2PF's) over the grid, a trip's bytes counted with the bit words and scales."""
    budget = PF.budget_bytes() if budget is None else budget
    if budget <= 0:
        return 0
    trips = row_words(p.fmt, p.k) // cfg.bw
    trip_bytes = p.walked_bytes() * cfg.block_n // max(1, p.qweight.shape[0] * trips)
    grid, main = grid_of(p, cfg)
    ctas = PF.resident(grid[0] * grid[1], p.sm_count, cfg.num_warps)
    return PF.l2_trips(budget, ctas, trip_bytes, trips if cfg.tail else _share(trips, cfg.splits))


def grid_of(p: QK.Prepared, cfg: KWConfig) -> tuple[tuple[int, int], int]:
    """(the launch grid, the row blocks walked whole): (row blocks, K shares), or with a tail a 1-D
    grid of the whole-K blocks then the tail's blocks times their shares."""
    blocks = -(-p.n // cfg.block_n)
    if not cfg.tail:
        return (blocks, cfg.splits), blocks
    main = blocks - min(cfg.tail, blocks)
    return (main + (blocks - main) * cfg.tail_splits, 1), main


def launch(x2: torch.Tensor, p: QK.Prepared, cfg: KWConfig, fast: bool | None = None, gated: bool = False,
           ablate: int = 0, l2_budget: int | None = None) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T for M <= 4 rows (gated: x2 is [M, 2k], the GEMV's input is
    silu(gate) * up, rounded to x2's dtype as silu_mul stores it). Two launches: x's pairs, then
    the GEMV. `ablate` = 1: a measurement only (no decode or multiply-adds; garbage out).
    `l2_budget`: bytes the grid asks the L2 for ahead (default NINFER_L2PF's, prefetch.py)."""
    m = x2.shape[0]
    if gated and (x2.shape[1] != 2 * p.k or x2.stride(1) != 1):
        raise ValueError(f"the K-walk GEMV's gated input is [M, 2 x {p.k}] with a unit last stride, got "
                         f"{tuple(x2.shape)} strides {tuple(x2.stride())}")
    if not gated and (x2.shape[1] != p.k or x2.stride(1) != 1):
        raise ValueError(f"the K-walk GEMV's input is [M, {p.k}] with a unit last stride, got {tuple(x2.shape)}")
    if m > MAX_M:
        raise ValueError(f"the K-walk GEMV takes at most {MAX_M} rows, got {m}")
    if cfg.splits & (cfg.splits - 1):
        raise ValueError(f"the K-walk GEMV's splits must be a power of two, got {cfg.splits}")
    if not supports(p, cfg):
        raise ValueError(f"the K-walk GEMV needs q4/q5/q6/q8 or NVFP4 and a row's words ({row_words(p.fmt, p.k)}) a "
                         f"multiple of BW, at least one trip a K share, BW a multiple of a K block's words and four words a thread "
                         f"(format {p.fmt}, K={p.k}, {cfg.describe()})")
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    block_m = QK.block_rows(m)
    fast = p.fast if fast is None else fast
    interp = QK.interpreting()
    reuse = reuse_inputs()
    if cfg.inline:
        # the GEMV's first CTAs make them
        xp, inv, invm = x_scratch(x2.device, p.fmt, p.k)
    else:
        xp, inv, invm = pairs_of(x2, p.fmt, p.k, block_m, fast and not interp, gated)
    # the interpreter runs the plain decode, unless a test has put an emulation of the PTX in
    # gemv_h2._dot_out's place (EMULATED_DOT): then the fast path's plumbing runs on the CPU
    fast = fast and (not interp or EMULATED_DOT)
    kw = row_words(p.fmt, p.k)
    if cfg.splits > 1 or cfg.tail:
        ws = QK.Workspace.get(x2.device)
        ws.ensure(*workspace_need(p, cfg), QK.capturing(x2))
        partials, counters = ws.partials, ws.counters
    else:
        partials = counters = inv  # never read
    w = p.qweight.view(torch.int32)
    h = p.qhigh.view(torch.int32) if p.qhigh is not None else w
    s = H2.scales_view(p.fmt, p.scales)
    g = p.gscale if p.gscale is not None else s
    asm, constr = H2._asm(p.fmt, block_m)
    grid, main = grid_of(p, cfg)
    # inline x pairs: one CTA makes them all in the interpreter (programs run one after another, in
    # order); on the GPU up to one an item, and no more than the SMs: the producers must all be
    # resident at once (they are the first CTAs dispatched, and an SM holds at least one), or
    # consumers spinning in every slot would keep a producer from ever starting
    producers = 1 if interp else min(block_m * (p.k // 128), grid[0] * grid[1], p.sm_count)
    l2pf = l2_ahead_trips(p, cfg, l2_budget)
    _gemv_kw_kernel[grid](
        xp, inv, invm, w, h, s, y, partials, counters, g, x2, ready_counters(x2.device),
        m, p.n, kw, p.k // 128, _share(kw // cfg.bw, cfg.splits), kw // cfg.bw, x2.stride(0), p.k if gated else 0, producers,
        w.stride(0), h.stride(0), s.stride(0), y.stride(0),
        main, _share(kw // cfg.bw, cfg.tail_splits) if cfg.tail else 1,
        FMT=p.fmt,
        BLOCK_N=cfg.block_n,
        BW=cfg.bw,
        SPLITS=cfg.splits,
        BLOCK_M=block_m,
        ASM=asm,
        CONSTR=constr,
        FAST=fast,
        PREFETCH=int(cfg.prefetch),
        ABLATE=ablate,
        INLINE=bool(cfg.inline),
        HEAD=H2.HEAD[p.fmt],
        GATED=gated,
        ASM_PAIRS=fast and not interp,
        L2PF=l2pf,
        PIN=bool(cfg.pin),
        TAIL_S=cfg.tail_splits if cfg.tail else 0,
        num_warps=cfg.num_warps,
        **pdl_kwargs(x2.device),
    )
    if cfg.inline and reuse:
        note_input(_pairs_key(x2.device, p.fmt, p.k), x2, (block_m, gated))  # its first CTAs wrote x2's pairs
    return y
