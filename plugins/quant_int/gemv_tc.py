"""Tensor-core decode GEMV (Gluon): packed q4/q5 words decoded in registers straight into the
A fragments of `mma.sync m16n8k16`, weights streamed through a cp.async ring in shared memory.

Why: the f16x2 GEMV (gemv_h2.py) pays one `fma.rn.f16x2` per two weights per activation row, so
M = 4 (the speculative verify) costs about twice M = 1, and it keeps at most one tile of weights
in flight in registers, which Nsight Compute showed latency-bound (BENCHMARKS.md). Here:
* the multiply-adds are tensor-core MMAs (swap-AB: the weights are A, 16 rows x 16 k; x is B,
  16 k x 8 tokens), so any M <= 8 costs the same instructions;
* decode is gemv_h2's fp16 magic-number decode (`lop3` + exact `sub.f16x2`) followed by one
  `mul.f16x2` by the group scale: about 1.6 instructions a weight for q4;
* bytes in flight do not cost registers: NS stages of the CTA's tile are copied with cp.async
  (16 bytes a copy) while the tensor cores work on the oldest one.

Layout trick (no shared-memory round trip for A): within one 128-element K block, the order of
k inside an MMA is free as long as x uses the same relabelling. Lane (g, t) of a warp (g = lane
/ 4, t = lane % 4) loads the 16-byte vector t of rows g and g + 8 of the block (four words, j =
0..3). Word j decodes into four f16x2 registers pa, pc (low nibbles: elements 16t + 4j + {0, 2}
and {1, 3}, group 2kb) and pb, pd (high nibbles, group 2kb + 1, decoded as 16 x code). Give
element 64 grp + 16 t + 4 j + 2 half + sel the logical k = half + 2 t + 8 sel + 16 grp + 32 j
(sel: pa/pb = 0, pc/pd = 1): then lane (g, t)'s registers are exactly its A fragments, and x is
stored in shared memory once per CTA in the matching order (`_x_index`), so each lane's B
fragment for a block is four 16-byte loads. The layouts are checked at compile time to meet
with no data movement (only a register renaming): see tests/plugins/quant_int/test_gemv_tc.py.

Scaling: decoded codes are multiplied by their fp16 group scale (one rounding, as a bf16
dequantize would) and x by a power of two per token and CTA (largest |x| of the slice in
[2^14, 2^15)), undone in fp32 at the end; the MMAs accumulate in fp32. The high-nibble values
carry 16 x (q5: 2, 16, 32) on the weight side, divided out on x's side (exact powers of two).
Weights whose scale times that factor could pass fp16's range are refused (`supports`).

Work split as gemv_h2: a CTA owns a K slice (KB blocks) and a chunk of rows, streams the chunk
R = 16 x num_warps rows a trip, writes fp32 partials; the last CTA of each row chunk sums the
slices in a fixed order (bit-reproducible, CUDA-graph safe).

The direct variant (`TCConfig.direct` = 1 or 2, `_gemv_tcd_kernel`) keeps the decode, the
relabelling and the split-K sum, and drops the ring: each lane loads its two rows' 16 bytes of a
K block straight into the registers the decode reads, 1 or 2 blocks ahead of the MMA (the
first ones before the PDL wait), so shared memory holds only x (8.5-17 KB against 78-111 KB) and
occupancy is set by registers (71-93). The last CTA's sum reads only M's tokens. It is what
`tuned.TUNED_TC` names for the verify's q5 projections (H200: M = 4 at 1.0-1.1x the M = 1 time;
BENCHMARKS.md "Tenth run").

Gluon has no interpreter: on the CPU `launch` runs `reference` (the same relabelling done in
torch), and the kernel itself is tested on the GPU (`-m gpu`) and compiled for sm_90 in
bench/compile_sm90_dense.py and bench/tc_sass.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ninfer.kernels.triton import sync as SY
from ninfer.kernels.triton.launch import pdl_kwargs, pdl_value
from ninfer_plugins.quant_int import gemv_h2 as H2
from ninfer_plugins.quant_int import kernels as QK

try:  # Gluon ships with Triton >= 3.5; its API is experimental
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    HAVE_GLUON = True
except Exception:  # pragma: no cover - older Triton
    HAVE_GLUON = False

MAX_M = 8
# slices the last CTA's sum loads at a time (`_sum_slices`): 8 x 4 columns = 32 values a thread
SUM_SC = 8
# set by bench/compile_sm90_dense.py: launch the kernel on CPU tensors (a compile-only driver)
COMPILE_ONLY = False
FORMATS = (4, 5)
# x is scaled so that its largest |value| in a CTA's slice lies in [2^XHEAD, 2^(XHEAD+1))
XHEAD = 14


def word_asm(fmt: int) -> tuple[str, str]:
    """PTX decoding one packed word into 8 biased fp16 weights, bias + factor x code (gemv_h2's
    decode without its subtraction; the bias comes off in fp32 after the MMA, `bias_of`):
    outputs $0..$3 = pa, pc, pb, pd (element order half + 2 sel + 4 grp); inputs (8 copies
    each, pack = 8): the word and, for q5, its ul / uh bit words (the kernel's `ul`, `uh`)."""
    names = ["W"] + (["UL", "UH"] if fmt == 5 else [])
    reg = {name: f"${4 + 8 * i}" for i, name in enumerate(names)}
    lines = ["{", ".reg .b32 w8, t1, ul, uh, pa, pb, pc, pd;"]
    if fmt == 4:
        lines += [line.replace("%W0", "%W") for line in H2._word_asm(4, 0) if not line.startswith("sub.")]
    else:
        lines += ["shr.b32 w8, %W, 7;", "mov.b32 ul, %UL;", "mov.b32 uh, %UH;"]
        lines += H2.q5_pair_lines("%W")
    # outputs written last: an output may share a register with an input
    lines += ["mov.b32 $0, pa;", "mov.b32 $1, pc;", "mov.b32 $2, pb;", "mov.b32 $3, pd;", "}"]
    text = "\n".join(lines)
    for name, r in sorted(reg.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"%{name}", r)
    constr = ",".join(["=r"] * 4 + ["r"] * (8 * len(names)))
    return text, constr


def bias_of(fmt: int, i: int) -> float:
    """The bias the decode leaves on register i (0..3 = pa, pb, pc, pd): the fp16 value of
    gemv_h2's constant for it (q4: 1024 + 8, 1024 + 128; q5: 1024 + 16, 1024 + 256, ...)."""
    bits = int(H2._SUB[fmt][i], 16) & 0xFFFF
    return float(torch.tensor([bits], dtype=torch.int16).view(torch.float16).item())


def logical_to_element(k: torch.Tensor) -> torch.Tensor:
    """Logical k (0..127, the MMA's order) -> element of the 128-wide K block it holds."""
    half, t, sel, grp, j = k % 2, (k // 2) % 4, (k // 8) % 2, (k // 16) % 2, k // 32
    return 64 * grp + 16 * t + 4 * j + 2 * half + sel


# --- the kernel ------------------------------------------------------------------------------

if HAVE_GLUON:
    XHEAD_C = gl.constexpr(XHEAD)
    SUM_SC_C = gl.constexpr(SUM_SC)
    ACQ_REL_C = gl.constexpr(SY.SPLIT_ACQ_REL)  # ninfer.kernels.triton.sync's arrival form
    FENCE_C = gl.constexpr(SY.FENCE_ACQ_REL.value)

    @gluon.jit
    def _issue(W, H, S, wsm, hsm, ssm, slot, row0, kb0, stride_wn, stride_hn, stride_sn,
               FMT: gl.constexpr, KB: gl.constexpr, R: gl.constexpr, LCW: gl.constexpr, LCS: gl.constexpr,
               LCH: gl.constexpr):
        """cp.async one trip's tile into ring slot `slot`, one copy op per buffer (Triton's
        barrier pass would put a bar.sync between two copies into one buffer): words [KB x R,
        4 t, 4 j] (16 bytes a copy), scales [KB x R] (the int32 fp16 pair of each row's block),
        q5 bit words [KB x R, 4 t, 2]; row kb x R + r is block kb of row r."""
        rr = gl.arange(0, KB * R, layout=gl.SliceLayout(1, gl.SliceLayout(2, LCW)))
        tt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LCW)))
        jj = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LCW)))
        woff = (row0 + rr % R).to(gl.int64) * stride_wn + (kb0 + rr // R) * 16
        cp.async_copy_global_to_shared(wsm.index(slot), W + woff[:, None, None] + (tt * 4)[None, :, None] + jj[None, None, :])
        sr = gl.arange(0, KB * R, layout=LCS)
        cp.async_copy_global_to_shared(ssm.index(slot), S + (row0 + sr % R).to(gl.int64) * stride_sn + (kb0 + sr // R))
        if FMT == 5:
            hr = gl.arange(0, KB * R, layout=gl.SliceLayout(1, gl.SliceLayout(2, LCH)))
            ht = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LCH)))
            hh = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, LCH)))
            # lane t's low-group bit word is word t // 2 of the block's four, its high-group one 2 + t // 2
            hoff = (row0 + hr % R).to(gl.int64) * stride_hn + (kb0 + hr // R) * 4
            cp.async_copy_global_to_shared(hsm.index(slot), H + hoff[:, None, None] + (ht // 2)[None, :, None]
                                           + (hh * 2)[None, None, :])

    @gluon.jit
    def _ring_buffers(NS: gl.constexpr, KB: gl.constexpr, R: gl.constexpr, FMT: gl.constexpr, SH3: gl.constexpr,
                      SH1: gl.constexpr):
        """A cp.async ring of NS stages, each KB blocks of R rows (`_issue`'s tile): words [KB x R, 4 t,
        4 j], scale pairs [KB x R], q5 bit words [KB x R, 4 t, 2] (q4: the scales' buffer again)."""
        wsm = gl.allocate_shared_memory(gl.int32, [NS, KB * R, 4, 4], SH3)
        ssm = gl.allocate_shared_memory(gl.int32, [NS, KB * R], SH1)
        if FMT == 5:
            hsm = gl.allocate_shared_memory(gl.int32, [NS, KB * R, 4, 2], SH3)
        else:
            hsm = ssm
        return wsm, ssm, hsm

    @gluon.jit
    def _pdl_trigger():
        """Let the next kernel in the stream launch (programmatic dependent launch)."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)

    @gluon.jit
    def _pdl_wait(PDL: gl.constexpr, LATE: gl.constexpr):
        """Under PDL: trigger the next kernel now unless LATE (then after the main loop), and wait for
        the kernel before to finish (its outputs, x among them, are read after this). PDL = 2
        (launch.late_dependents): the trigger comes after the wait."""
        if PDL:
            if not LATE and PDL != 2:
                _pdl_trigger()
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            if not LATE and PDL == 2:
                _pdl_trigger()

    # Triton 3.6's name (the H200's) and Triton 3.9's
    _tbarrier = getattr(gl, "thread_barrier", None) or getattr(gl, "barrier", None)

    @gluon.jit
    def _prep_x(X, M, stride_xm, kb0, xsm, csm, KB: gl.constexpr, LX: gl.constexpr, MMA: gl.constexpr,
                XF_A: gl.constexpr, XF_B: gl.constexpr, XF_C: gl.constexpr, XF_D: gl.constexpr,
                BIAS_A: gl.constexpr, BIAS_B: gl.constexpr, BIAS_C: gl.constexpr, BIAS_D: gl.constexpr):
        """x of this CTA's slice into shared memory, times a power of two per token (largest |x|
        in [2^14, 2^15)) and the decode's factor (XF), rounded to fp16, in the MMA's k order (see
        logical_to_element); per group and token, the sum of bias x stored x (`csm`). Loaded in
        element order ([8 tokens, 64] a group, 8-byte vectors), relabelled in registers. Returns
        1 / the scaling per token, in the MMA layout's token axis."""
        nn = gl.arange(0, 8, layout=gl.SliceLayout(1, LX))
        ee = gl.arange(0, 64, layout=gl.SliceLayout(0, LX))
        xp = X + nn[:, None].to(gl.int64) * stride_xm + (kb0 * 128 + ee)[None, :]
        xmask = (nn < M)[:, None]
        sel = ee % 2
        amax = gl.zeros([8], gl.float32, layout=gl.SliceLayout(1, LX))
        for kg in gl.static_range(KB * 2):
            xv = gl.load(xp + kg * 64, mask=xmask, other=0.0).to(gl.float32)
            amax = gl.maximum(amax, gl.max(gl.abs(xv), axis=1))
        ex = ((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127
        e = XHEAD_C - gl.minimum(gl.maximum(ex, -100), 100)
        f = ((e + 127) << 23).to(gl.float32, bitcast=True)
        inv = ((127 - e) << 23).to(gl.float32, bitcast=True)
        for kg in gl.static_range(KB * 2):
            xv = gl.load(xp + kg * 64, mask=xmask, other=0.0).to(gl.float32)
            if kg % 2 == 0:
                fac = gl.where(sel == 0, XF_A, XF_C)
                bias = gl.where(sel == 0, BIAS_A, BIAS_C)
            else:
                fac = gl.where(sel == 0, XF_B, XF_D)
                bias = gl.where(sel == 0, BIAS_B, BIAS_D)
            xs = (xv * f[:, None] * fac[None, :]).to(gl.float16)
            csm.index(kg).store(gl.sum(xs.to(gl.float32) * bias[None, :], axis=1))
            # element e = 16 t + 8 jh + 4 jl + 2 half + sel -> [jh, n, t, (jl, sel, half)]
            xs = gl.permute(gl.reshape(xs, [8, 4, 2, 2, 2, 2]), [2, 0, 1, 3, 5, 4])
            xsm.index(kg).store(gl.reshape(xs, [2, 8, 4, 8]))
        return gl.convert_layout(inv, gl.SliceLayout(0, MMA))

    @gluon.jit
    def _sum_slices(Y, WS, CNT, pid_c, row_lo, row_hi, M, N, stride_ym, N_SLICES, SLICES_P2: gl.constexpr,
                    RED: gl.constexpr, MT: gl.constexpr, LRED: gl.constexpr):
        """The last slice of this row chunk to arrive sums all slices' partials WS[slice, token,
        row] in a fixed order (bit-reproducible) into Y: RED rows a step, MT tokens at once
        (column = token x RED + row, MT x RED = LRED's 4 x 32 x warps columns), SUM_SC slices a
        load, then resets the chunk's counter. The slices are a loop, not one [SLICES_P2, ...]
        tile: a thread holds every slice of its columns, and 17-34 slices (the 27B's down_proj)
        made this the kernel's register peak (168-255 registers, the main loop needs ~90)."""
        # a release per slice; the last one's acq_rel fence then sees every slice's partial
        # (ninfer.kernels.triton.sync.arrive / acquire_all, written out for Gluon)
        if ACQ_REL_C:
            arrived = gl.atomic_add(CNT + pid_c, 1, sem="acq_rel")
        else:
            arrived = gl.atomic_add(CNT + pid_c, 1, sem="release")
        if arrived == N_SLICES - 1:
            if not ACQ_REL_C:
                arrived = gl.inline_asm_elementwise(FENCE_C, "=r,r", [arrived], dtype=gl.int32, is_pure=False, pack=1)
            SC: gl.constexpr = SUM_SC_C if SLICES_P2 > SUM_SC_C else SLICES_P2
            sl_ = gl.arange(0, SC, layout=gl.SliceLayout(1, LRED))
            cc = gl.arange(0, RED * MT, layout=gl.SliceLayout(0, LRED))
            tok = cc // RED
            for r0 in range(row_lo, row_hi, RED):
                rr = r0 + cc % RED
                ok = (rr < row_hi) & (tok < M)
                acc = gl.zeros([RED * MT], gl.float32, layout=gl.SliceLayout(0, LRED))
                for s0 in range(0, N_SLICES, SC):
                    sl = s0 + sl_
                    p = gl.load(WS + ((sl[:, None] * 8 + tok[None, :]) * N).to(gl.int64) + rr[None, :],
                                mask=(sl < N_SLICES)[:, None] & ok[None, :], other=0.0, cache_modifier=".cg")
                    acc += gl.sum(p, 0)
                gl.store(Y + tok * stride_ym + rr, acc.to(Y.dtype.element_ty), mask=ok)
            if ACQ_REL_C:
                gl.atomic_xchg(CNT + pid_c, 0)
            else:
                gl.atomic_xchg(CNT + pid_c, 0, sem="relaxed")

    @gluon.jit(do_not_specialize=["M", "N", "ROWS_PER_CTA", "N_SLICES"])
    def _gemv_tc_kernel(
        X, W, H, S, Y, WS, CNT,
        M, N,
        stride_xm, stride_wn, stride_hn, stride_sn, stride_ym,
        ROWS_PER_CTA, N_SLICES,
        FMT: gl.constexpr, KB: gl.constexpr, NS: gl.constexpr, R: gl.constexpr, SLICES_P2: gl.constexpr,
        RED: gl.constexpr,
        ASM: gl.constexpr, CONSTR: gl.constexpr,
        XF_A: gl.constexpr, XF_B: gl.constexpr, XF_C: gl.constexpr, XF_D: gl.constexpr,
        BIAS_A: gl.constexpr, BIAS_B: gl.constexpr, BIAS_C: gl.constexpr, BIAS_D: gl.constexpr,
        L5: gl.constexpr, LCW: gl.constexpr, LCS: gl.constexpr, LCH: gl.constexpr, LX: gl.constexpr,
        LB4: gl.constexpr, LH3: gl.constexpr, LRED: gl.constexpr,
        MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr, SH4: gl.constexpr, SH3: gl.constexpr, SH1: gl.constexpr,
    ):
        pid_c = gl.program_id(0)
        pid_s = gl.program_id(1)
        kb0 = pid_s * KB
        row_lo = pid_c * ROWS_PER_CTA
        row_hi = gl.minimum(row_lo + ROWS_PER_CTA, N)
        trips = gl.cdiv(row_hi - row_lo, R)

        wsm, ssm, hsm = _ring_buffers(NS, KB, R, FMT, SH3, SH1)
        # x per (block, group): [2 jh, 8 n, 4 t, 8 v], v = half + 2 sel + 4 jl (j = jl + 2 jh)
        xsm = gl.allocate_shared_memory(gl.float16, [KB * 2, 2, 8, 4, 8], SH4)
        # per (block, group) and token: sum over the group of bias x stored x (the decode's bias)
        csm = gl.allocate_shared_memory(gl.float32, [KB * 2, 8], SH1)

        # the first stages go out before x is prepared (they do not depend on it)
        for i in gl.static_range(NS - 1):
            r0 = row_lo + gl.minimum(i, trips - 1) * R
            _issue(W, H, S, wsm, hsm, ssm, i, r0, kb0, stride_wn, stride_hn, stride_sn, FMT, KB, R, LCW, LCS, LCH)
            cp.commit_group()

        inv_n = _prep_x(X, M, stride_xm, kb0, xsm, csm, KB, LX, MMA, XF_A, XF_B, XF_C, XF_D,
                        BIAS_A, BIAS_B, BIAS_C, BIAS_D)

        ym = gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
        yn = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
        for i in range(trips):
            cp.wait_group(NS - 2)
            _tbarrier()
            slot = i % NS
            nxt = i + NS - 1
            r_n = row_lo + gl.minimum(nxt, trips - 1) * R
            s_n = nxt % NS
            _issue(W, H, S, wsm, hsm, ssm, s_n, r_n, kb0, stride_wn, stride_hn, stride_sn, FMT, KB, R, LCW, LCS, LCH)
            cp.commit_group()

            acc = gl.zeros([R, 8], gl.float32, layout=MMA)
            for kb in gl.static_range(KB):
                w = wsm.index(slot).slice(kb * R, R).load(gl.SliceLayout(3, L5))  # [R, 4 t, 4 j]
                sc = ssm.index(slot).slice(kb * R, R).load(gl.SliceLayout(1, MMA))  # fp16 pair (group 2kb, 2kb + 1)
                if FMT == 5:
                    hw = hsm.index(slot).slice(kb * R, R).load(LH3)  # [R, 4 t, 2]: low-group, high-group bit words
                else:
                    hw = sc
                acc = _block_mma(acc, w, sc, hw, xsm, csm, kb, FMT, R, ASM, CONSTR, L5, LH3, LB4, MMA, A_L, B_L)
            rows = row_lo + i * R + ym
            # partials WS[slice, token, row]: a warp's rows of one token are contiguous
            dst = WS + rows.to(gl.int64)[:, None] + ((pid_s * 8 + yn) * N).to(gl.int64)[None, :]
            keep = (rows < row_hi)[:, None] & (yn < M)[None, :]
            gl.store(dst, acc * inv_n[None, :], mask=keep)
        cp.wait_group(0)

        _tbarrier()
        _sum_slices(Y, WS, CNT, pid_c, row_lo, row_hi, M, N, stride_ym, N_SLICES, SLICES_P2, RED, 8, LRED)


    @gluon.jit
    def _block_ptrs(W, H, S, stride_wn, stride_hn, stride_sn, FMT: gl.constexpr, R: gl.constexpr, L5: gl.constexpr,
                    MMA: gl.constexpr, LH3: gl.constexpr):
        """Pointers of K block 0 of rows 0..R-1, in the layouts the decode reads: words [R, 4 t, 4 j]
        (lane (g, t): 16 bytes of rows g and g + 8), the fp16 scale pair [R], q5's bit words
        [R, 4 t, 2]; a block is these plus a scalar offset (_load_block)."""
        LW: gl.constexpr = gl.SliceLayout(3, L5)
        rr = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, LW)))
        tt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LW)))
        jj = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LW)))
        wp = W + (rr * stride_wn)[:, None, None] + (tt * 4)[None, :, None] + jj[None, None, :]
        sr = gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
        sp = S + sr * stride_sn
        if FMT == 5:
            hr = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, LH3)))
            ht = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LH3)))
            hh = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, LH3)))
            hp = H + (hr * stride_hn)[:, None, None] + (ht // 2)[None, :, None] + (hh * 2)[None, None, :]
        else:
            hp = sp
        return wp, sp, hp

    @gluon.jit
    def _load_block(wp, sp, hp, r0, kb, stride_wn, stride_hn, stride_sn, FMT: gl.constexpr):
        """K block kb of rows r0.. straight into registers: words, scales, q5 bit words."""
        r64 = r0.to(gl.int64)
        w = gl.load(wp + (r64 * stride_wn + kb * 16))
        s = gl.load(sp + (r64 * stride_sn + kb))
        if FMT == 5:
            hw = gl.load(hp + (r64 * stride_hn + kb * 4))
        else:
            hw = s
        return w, s, hw

    @gluon.jit
    def _decode_block(w, s, hw, FMT: gl.constexpr, R: gl.constexpr, ASM: gl.constexpr, CONSTR: gl.constexpr,
                      L5: gl.constexpr, LH3: gl.constexpr):
        """One K block's words (and q5 bit words) decoded in registers: (d_lo, d_hi), each group's
        [R, 4, 2, 4, 2] biased fp16 codes in the MMA's k order (`_group_mma` renames them into A
        fragments), and the groups' fp16 scales as fp32 [R]."""
        s_lo = (s & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        s_hi = ((s >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        wb = gl.broadcast(w[:, :, :, None], gl.full([R, 4, 4, 8], 0, gl.int32, layout=L5))[0]
        if FMT == 5:
            ht = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LH3)))
            hsh = (ht % 2) * 16
            j4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L5))))
            hl, hh = gl.split(hw)
            sa = (hl >> hsh[None, :]) & 0xFFFF
            sa = sa | (sa << 14)
            sb = (hh >> hsh[None, :]) & 0xFFFF
            sb = sb | (sb << 14)
            sa4 = gl.convert_layout(sa, gl.SliceLayout(2, gl.SliceLayout(3, L5)))[:, :, None]
            sb4 = gl.convert_layout(sb, gl.SliceLayout(2, gl.SliceLayout(3, L5)))[:, :, None]
            jb = j4[None, None, :]
            ul = gl.where(jb == 0, sa4 << 4, sa4 >> gl.maximum(4 * jb - 4, 0))
            uh = gl.where(jb == 0, sb4 << 8, gl.where(jb == 1, sb4 << 4, sb4 >> gl.maximum(4 * jb - 8, 0)))
            ulb = gl.broadcast(ul[:, :, :, None], wb)[0]
            uhb = gl.broadcast(uh[:, :, :, None], wb)[0]
            d = gl.inline_asm_elementwise(ASM, CONSTR, [wb, ulb, uhb], dtype=gl.float16, is_pure=True, pack=8)
        else:
            d = gl.inline_asm_elementwise(ASM, CONSTR, [wb], dtype=gl.float16, is_pure=True, pack=8)
        d = gl.reshape(d, [R, 4, 4, 2, 2, 2])
        d = gl.permute(d, [0, 2, 4, 1, 5, 3])
        d_lo, d_hi = gl.split(d)
        return d_lo, d_hi, s_lo, s_hi

    @gluon.jit
    def _group_mma(d, xb, R: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr):
        """One group's MMA [R, 8]: its decoded codes d (from _decode_block) as A, x's fragments
        xb [2 jh, 8 n, 4 t, 8 v] (in LB4, as _prep_x stores them) as B; both are renamings, no
        data moves (test_gemv_tc.py checks the layouts)."""
        a = gl.convert_layout(gl.reshape(d, [R, 64]), A_L)
        xb = gl.reshape(xb, [2, 8, 4, 2, 2, 2])
        xb = gl.permute(xb, [0, 3, 4, 2, 5, 1])
        b = gl.convert_layout(gl.reshape(xb, [64, 8]), B_L)
        return mma_v2(a, b, gl.zeros([R, 8], gl.float32, layout=MMA))

    @gluon.jit
    def _block_mma(acc, w, s, hw, xsm, csm, kb: gl.constexpr, FMT: gl.constexpr, R: gl.constexpr, ASM: gl.constexpr,
                   CONSTR: gl.constexpr, L5: gl.constexpr, LH3: gl.constexpr, LB4: gl.constexpr, MMA: gl.constexpr,
                   A_L: gl.constexpr, B_L: gl.constexpr):
        """acc [R, 8] += one K block's two groups, from its words, scales and q5 bit words in registers
        (both kernels' inner step: the ring kernel loads them from shared memory, the direct one from
        global memory)."""
        d_lo, d_hi, s_lo, s_hi = _decode_block(w, s, hw, FMT, R, ASM, CONSTR, L5, LH3)
        for g in gl.static_range(2):
            if g == 0:
                d = d_lo
                sg = s_lo
            else:
                d = d_hi
                sg = s_hi
            c = _group_mma(d, xsm.index(kb * 2 + g).load(LB4), R, MMA, A_L, B_L)
            cg = csm.index(kb * 2 + g).load(gl.SliceLayout(0, MMA))
            acc += (c - cg[None, :]) * sg[:, None]
        return acc

    @gluon.jit(do_not_specialize=["M", "N", "ROWS_PER_CTA", "N_SLICES"])
    def _gemv_tcd_kernel(
        X, W, H, S, Y, WS, CNT,
        M, N,
        stride_xm, stride_wn, stride_hn, stride_sn, stride_ym,
        ROWS_PER_CTA, N_SLICES,
        FMT: gl.constexpr, KB: gl.constexpr, PF: gl.constexpr, R: gl.constexpr, SLICES_P2: gl.constexpr,
        RED: gl.constexpr, MT: gl.constexpr, PDL: gl.constexpr,
        ASM: gl.constexpr, CONSTR: gl.constexpr,
        XF_A: gl.constexpr, XF_B: gl.constexpr, XF_C: gl.constexpr, XF_D: gl.constexpr,
        BIAS_A: gl.constexpr, BIAS_B: gl.constexpr, BIAS_C: gl.constexpr, BIAS_D: gl.constexpr,
        L5: gl.constexpr, LCW: gl.constexpr, LCS: gl.constexpr, LCH: gl.constexpr, LX: gl.constexpr,
        LB4: gl.constexpr, LH3: gl.constexpr, LRED: gl.constexpr,
        MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr, SH4: gl.constexpr, SH3: gl.constexpr, SH1: gl.constexpr,
        LATE: gl.constexpr = False,
    ):
        """The ring kernel's arithmetic with the weights loaded straight into the registers the
        decode reads (no shared-memory ring, so occupancy is set by registers): K blocks stream
        one at a time, PF (1 or 2) blocks ahead of the one being multiplied. MT: the tokens the
        last CTA's sum reads (M rounded up to a power of two). LATE (with PDL): the next kernel
        may launch only once this CTA's partials are written, not at its start (`late_trigger`,
        the default)."""
        pid_c = gl.program_id(0)
        pid_s = gl.program_id(1)
        kb0 = pid_s * KB
        row_lo = pid_c * ROWS_PER_CTA
        row_hi = gl.minimum(row_lo + ROWS_PER_CTA, N)
        trips = gl.cdiv(row_hi - row_lo, R)
        last = row_lo + (trips - 1) * R

        xsm = gl.allocate_shared_memory(gl.float16, [KB * 2, 2, 8, 4, 8], SH4)
        csm = gl.allocate_shared_memory(gl.float32, [KB * 2, 8], SH1)

        # the first blocks go out before x is read (weights: no kernel writes them)
        wp, sp, hp = _block_ptrs(W, H, S, stride_wn, stride_hn, stride_sn, FMT, R, L5, MMA, LH3)
        wa, sa, ha = _load_block(wp, sp, hp, row_lo, kb0, stride_wn, stride_hn, stride_sn, FMT)
        if PF == 2:
            if KB > 1:
                wb_, sb_, hb_ = _load_block(wp, sp, hp, row_lo, kb0 + 1, stride_wn, stride_hn, stride_sn, FMT)
            else:
                r1 = gl.minimum(row_lo + R, last)
                wb_, sb_, hb_ = _load_block(wp, sp, hp, r1, kb0, stride_wn, stride_hn, stride_sn, FMT)
        _pdl_wait(PDL, LATE)

        inv_n = _prep_x(X, M, stride_xm, kb0, xsm, csm, KB, LX, MMA, XF_A, XF_B, XF_C, XF_D,
                        BIAS_A, BIAS_B, BIAS_C, BIAS_D)
        _tbarrier()  # x's shared copy, written by every warp, is read by every warp
        ym = gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
        yn = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))

        for i in range(trips):
            acc = gl.zeros([R, 8], gl.float32, layout=MMA)
            for kb in gl.static_range(KB):
                # the block PF ahead: (trip, block) of this one + PF, the last tile again past the end
                nk = kb + PF
                r_n = gl.minimum(row_lo + (i + nk // KB) * R, last)
                wn, sn, hn = _load_block(wp, sp, hp, r_n, kb0 + nk % KB, stride_wn, stride_hn, stride_sn, FMT)
                acc = _block_mma(acc, wa, sa, ha, xsm, csm, kb, FMT, R, ASM, CONSTR, L5, LH3, LB4, MMA, A_L, B_L)
                if PF == 2:
                    wa, sa, ha = wb_, sb_, hb_
                    wb_, sb_, hb_ = wn, sn, hn
                else:
                    wa, sa, ha = wn, sn, hn
            rows = row_lo + i * R + ym
            dst = WS + rows.to(gl.int64)[:, None] + ((pid_s * 8 + yn) * N).to(gl.int64)[None, :]
            keep = (rows < row_hi)[:, None] & (yn < M)[None, :]
            gl.store(dst, acc * inv_n[None, :], mask=keep)

        if PDL and LATE:
            _pdl_trigger()
        _tbarrier()
        _sum_slices(Y, WS, CNT, pid_c, row_lo, row_hi, M, N, stride_ym, N_SLICES, SLICES_P2, RED, MT, LRED)



# --- host side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TCConfig:
    kb: int = 4  # K blocks of 128 per slice
    stages: int = 4  # cp.async ring depth
    num_warps: int = 4  # R = 16 x num_warps rows a trip
    ctas: int = 4  # target CTAs per SM (sets the row chunk)
    # > 0: the direct kernel (weights straight into registers, this many K blocks ahead; 1 or 2),
    # `stages` unused; 0: the cp.async ring
    direct: int = 0

    def describe(self) -> str:
        if self.direct:
            return f"TCD KB{self.kb} P{self.direct} w{self.num_warps} C{self.ctas}"
        return f"TC KB{self.kb} S{self.stages} w{self.num_warps} C{self.ctas}"

    def workspace(self, p: QK.Prepared) -> tuple[int, int]:
        chunks, n_slices, _ = grid_of(p, self)
        return n_slices * MAX_M * p.n, chunks

    def run(self, x2: torch.Tensor, p: QK.Prepared, fast: bool | None = None) -> torch.Tensor:
        return launch(x2, p, self)


def late_trigger() -> bool:
    """The direct kernel lets the next kernel launch after its main loop instead of at its start
    (default since the tenth session; NINFER_TC_LATE=0 triggers at the start again). The 27B MTP
    round went 12.83 -> 12.60 ms with it, plain step unchanged (BENCHMARKS.md, "Twelfth run").
    Why: in the 27B step every q4/q5 GEMV on the direct kernel (NINFER_TCD=1) cost 2.1 ms more
    than the f16x2 GEMVs with PDL on and 0.74 ms more with it off, while the GEMVs' own kernel
    time was the same (BENCHMARKS.md, "Eleventh run"): the neighbours launched early seem to be
    what slows."""
    return os.environ.get("NINFER_TC_LATE", "1") != "0"


def enabled() -> bool:
    """NINFER_TC=0 takes this kernel out of the dispatch; on by default where Gluon exists."""
    return HAVE_GLUON and os.environ.get("NINFER_TC", "1") != "0"


def supports(p: QK.Prepared, cfg: TCConfig) -> bool:
    return (p.fmt in FORMATS and p.k % (128 * cfg.kb) == 0 and QK.ROW_PAD % (16 * cfg.num_warps) == 0
            and cfg.direct in (0, 1, 2))


def direct_default(fmt: int, n: int, k: int) -> TCConfig | None:
    """The direct kernel's config where none is tuned: 8 K blocks a slice on long K, else 4."""
    for kb in ((8, 4) if k >= 16384 else (4, 8)):
        if fmt in FORMATS and k % (128 * kb) == 0:
            return TCConfig(kb, 0, 4, 6, 2)
    return None


def grid_of(p: QK.Prepared, cfg: TCConfig) -> tuple[int, int, int]:
    """(row chunks, K slices, rows per chunk) of a launch."""
    n_slices = p.k // (128 * cfg.kb)
    chunks, rows = QK.row_chunks(p, 16 * cfg.num_warps, n_slices, cfg.ctas)
    return chunks, n_slices, rows


_CONSTS: dict = {}


def _consts(fmt: int, cfg: TCConfig) -> dict:
    key = (fmt, cfg.kb, cfg.num_warps)
    if key in _CONSTS:
        return _CONSTS[key]
    nw, kb = cfg.num_warps, cfg.kb
    r = 16 * nw
    wbits = [1 << i for i in range(nw.bit_length() - 1)]
    kbits = [1 << i for i in range(kb.bit_length() - 1)]
    # decoded tile [R, 4 t, 4 j, 8 e]: e (the asm's pack) innermost, then j, row + 8; lanes t, g
    l5 = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 2, 0], [8, 0, 0, 0]],
        lane_bases=[[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=[[16 * w, 0, 0, 0] for w in wbits], block_bases=[], shape=[r, 4, 4, 8])
    # cp.async of one block's words [R, 4 t, 4 j]: 16 bytes a copy (j), each lane its rows g, g + 8
    lcw = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]] + [[r * b, 0, 0] for b in kbits],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16 * w, 0, 0] for w in wbits], block_bases=[], shape=[kb * r, 4, 4])
    lcs = gl.BlockedLayout([1], [32], [nw], [0])
    lch = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [8, 0, 0]] + [[r * b, 0, 0] for b in kbits],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16 * w, 0, 0] for w in wbits], block_bases=[], shape=[kb * r, 4, 2])
    # the q5 bit words as a lane reads them: [R, 4 t, 2 (low, high group)]
    lh3 = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [8, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16 * w, 0, 0] for w in wbits], block_bases=[], shape=[r, 4, 2])
    lx = gl.BlockedLayout([1, 4], [2, 16], [nw, 1], [1, 0])  # x's [8 n, 64 elements] per group
    # x's B fragments per group [2 jh, 8 n, 4 t, 8 v]: lane (g = n, t) reads its 2 x 16 bytes; all warps alike
    lb4 = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [1, 0, 0, 0]],
        lane_bases=[[0, 0, 1, 0], [0, 0, 2, 0], [0, 1, 0, 0], [0, 2, 0, 0], [0, 4, 0, 0]],
        warp_bases=[[0, 0, 0, 0] for _ in wbits], block_bases=[], shape=[2, 8, 4, 8])
    lred = gl.BlockedLayout([1, 4], [1, 32], [1, nw], [1, 0])
    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[nw, 1], instr_shape=[16, 8])
    out = dict(
        L5=l5, LCW=lcw, LCS=lcs, LCH=lch, LX=lx, LB4=lb4, LH3=lh3, LRED=lred, MMA=mma,
        A_L=gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2),
        B_L=gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2),
        SH4=gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]), SH3=gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]),
        SH1=gl.SwizzledSharedLayout(1, 1, 1, [0]),
    )
    asm, constr = word_asm(fmt)
    xf = H2.X_FACTORS[fmt]
    bias = [bias_of(fmt, i) for i in range(4)]
    out.update(ASM=asm, CONSTR=constr, XF_A=xf[0], XF_B=xf[1], XF_C=xf[2], XF_D=xf[3],
               BIAS_A=bias[0], BIAS_B=bias[1], BIAS_C=bias[2], BIAS_D=bias[3])
    _CONSTS[key] = out
    return out


def red_rows(num_warps: int, tokens: int = 8) -> int:
    """Rows the last CTA sums a step: MT x RED columns fill LRED's 4 x 32 x num_warps exactly
    (fewer would replicate each thread's values across threads, more would repeat them in
    registers); the slices are a loop of SUM_SC, whatever their count."""
    return max(1, (4 * 32 * num_warps) // tokens)


def reference(x2: torch.Tensor, p: QK.Prepared, cfg: TCConfig, w: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's arithmetic in torch (CPU path and test oracle): exact fp32 weights (the
    kernel multiplies codes by x, then by the fp32 scale; `w`: p already dequantized), x scaled
    per token and slice by the same power of two and rounded to fp16, fp32 sums per slice,
    slices summed in order."""
    from ninfer_plugins.quant_int.linear import dequantize_int_prepared

    m = x2.shape[0]
    w = dequantize_int_prepared(p) if w is None else w  # [n, k]; k is whole slices (supports)
    xs = x2.to(torch.float32)
    slice_k = 128 * cfg.kb
    y = torch.zeros((m, p.n), dtype=torch.float32, device=x2.device)
    for s in range(p.k // slice_k):
        xsl = xs[:, s * slice_k:(s + 1) * slice_k]
        amax = xsl.abs().amax(dim=1)
        ex = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-38))), torch.full_like(amax, -127.0))
        e = XHEAD - ex.clamp(-100, 100)
        xq = (xsl * torch.exp2(e)[:, None]).to(torch.float16).to(torch.float32)
        y += (xq @ w[:, s * slice_k:(s + 1) * slice_k].T) * torch.exp2(-e)[:, None]
    return y.to(x2.dtype)


def launch(x2: torch.Tensor, p: QK.Prepared, cfg: TCConfig) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T for M <= 8 rows."""
    m = x2.shape[0]
    if m > MAX_M:
        raise ValueError(f"the tensor-core GEMV takes at most {MAX_M} rows, got {m}")
    if not supports(p, cfg):
        raise ValueError(f"the tensor-core GEMV needs q4/q5 and K % {128 * cfg.kb} == 0 "
                         f"(format {p.fmt}, K={p.k}, {cfg.describe()})")
    if (x2.device.type != "cuda" and not COMPILE_ONLY) or QK.interpreting():
        return reference(x2, p, cfg)
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    chunks, n_slices, rows_per_cta = grid_of(p, cfg)
    ws = QK.Workspace.get(x2.device)
    ws.ensure(*cfg.workspace(p), QK.capturing(x2))
    w = p.qweight.view(torch.int32)
    h = p.qhigh.view(torch.int32) if p.qhigh is not None else w
    s = p.scales.view(torch.int32)
    c = _consts(p.fmt, cfg)
    slices_p2 = 1 << max(0, (n_slices - 1).bit_length())
    if cfg.direct:
        mt = 1 << max(0, (m - 1).bit_length())
        pdl = pdl_kwargs(x2.device) if x2.is_cuda else ({"PDL": pdl_value()} if COMPILE_ONLY == "pdl" else {})
        _gemv_tcd_kernel[(chunks, n_slices)](
            x2, w, h, s, y, ws.partials, ws.counters,
            m, p.n,
            x2.stride(0), w.stride(0), h.stride(0), s.stride(0), y.stride(0),
            rows_per_cta, n_slices,
            FMT=p.fmt, KB=cfg.kb, PF=cfg.direct, R=16 * cfg.num_warps,
            SLICES_P2=slices_p2, RED=red_rows(cfg.num_warps, mt), MT=mt,
            PDL=pdl.get("PDL", False), LATE=late_trigger(),
            num_warps=cfg.num_warps,
            **({"launch_pdl": True} if pdl and x2.is_cuda else {}),
            **c,
        )
        return y
    _gemv_tc_kernel[(chunks, n_slices)](
        x2, w, h, s, y, ws.partials, ws.counters,
        m, p.n,
        x2.stride(0), w.stride(0), h.stride(0), s.stride(0), y.stride(0),
        rows_per_cta, n_slices,
        FMT=p.fmt, KB=cfg.kb, NS=cfg.stages, R=16 * cfg.num_warps,
        SLICES_P2=slices_p2, RED=red_rows(cfg.num_warps),
        num_warps=cfg.num_warps,
        **c,
    )
    return y
