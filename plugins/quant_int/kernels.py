"""Fused dequantize + matmul (W4A16-style, weights decoded in registers, bf16 MMA via tl.dot).

One Triton kernel serves every format of both quantization plugins (q4/q5/q6 g64, q8 g32, NVFP4)
and every M: it computes the transposed tile `W[BN rows] @ X[BM rows]^T`, so the weight (decoded
in registers) is the MMA's A operand and the few activation rows are its N side ("swap AB": the
MMA's M is at least 64 weight rows even when only one token is in flight). Decode (M <= 16: one
token, a speculative verify, a small batch) and prefill (M in the thousands) differ only in block
sizes and split-K, chosen by `pick_config` from measurements (BENCHMARKS.md).

Weight layout (see formats.py): a K block of 128 is 64 bytes per row, low nibbles = the first 64
elements, high nibbles = the next 64, so each 64-byte load decodes into two whole 64-element
halves with no interleaving, and for the int formats each half is exactly one scale group. Up to
M = 64 the int scales are applied to the fp32 accumulator after each half's dot (codes are exact
in bf16, scales loaded a block ahead); prefill blocks multiply them into the bf16 weights (one
rounding) so the dots chain, since the accumulator way costs BM/64 FMAs per weight. NVFP4 is
repacked once ("g16-split8-f16", quant_nvfp4/kernels.py) and its block scale (per 16) multiplied into
the decoded bf16 weights, exactly: an E2M1 value times an E4M3 scale has at most 5 significant
bits.

Split-K (decode of matrices with few row blocks): each split writes an fp32 partial tile to a
workspace and bumps a per-tile counter; the last split to arrive sums all partials in a fixed
order (so results are bit-reproducible), writes y and resets the counter. One launch, no memset,
CUDA-graph safe; it assumes linears run one at a time on one stream (the engine's case).

Measured (BENCHMARKS.md, H200): 35-41% of the copy bandwidth at M = 1 on the 27B's big matrices
in q4 (58% on the head), flat from M = 1 to 16; the loop is latency-bound per CTA (async-copy
wait, barrier and wgmma wait each iteration at five CTAs per SM), not bandwidth-bound.

`FAST` selects the packed-register decode written in PTX (`inline_asm_elementwise`: two weights
per 32-bit op through byte permutes and bf16x2 arithmetic, spec-free bit tricks explained beside
each string). Without it the decode is plain Triton arithmetic, which is what TRITON_INTERPRET=1
runs on CPU in CI; the GPU tests check both against the fp32 reference.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

# Format ids of the kernel (a constexpr): the int formats by code width, NVFP4 apart.
Q4, Q5, Q6, Q8, NVFP4 = 4, 5, 6, 8, 16


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def block_rows(m: int) -> int:
    """The x rows a GEMV of m <= 4 rows works on: m rounded up to 1, 2 or 4 (its BLOCK_M; the
    prepared x pairs hold that many, zeros past m)."""
    return 1 if m == 1 else 2 if m == 2 else 4


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue  # noqa: E402
from ninfer.kernels.triton import sync as SY  # noqa: E402

# --- packed decode in PTX ------------------------------------------------------------------------
# Int codes are two's complement nibbles. Each asm instance takes two bytes (Triton hands the MMA
# operand's k-pairs over in one register) and returns the two low-nibble codes and the two
# high-nibble codes as bf16x2. prmt places byte 0 and byte 1 under the bf16 exponent byte 0x43
# (selector nibble i names the source byte of output byte i: 0-3 first operand, 4-7 second); a
# nibble u under 0x43 reads as 128 + u, exactly (u < 128 fits the 7 mantissa bits); lop3 keeps one
# nibble and flips its bit 3 (nibble ^ 8 = code + 8), then an fma with -136 leaves the code.
_Q4_BODY = """
.reg .b32 d, t, mag, one, bias, nz;
mov.b32 mag, 0x43434343;
mov.b32 one, 0x3F803F80;
mov.b32 bias, 0xC308C308;
mov.b32 nz, 0x80008000;
prmt.b32 d, $2, mag, 0x5140;
lop3.b32 $0, d, 0xFF0FFF0F, 0x00080008, 0x6a;
shr.u32 t, d, 4;
lop3.b32 $1, t, 0x000F000F, 0x43084308, 0x6a;
fma.rn.bf16x2 $0, $0, one, bias;
fma.rn.bf16x2 $1, $1, one, bias;
"""
ASM_Q4 = tl.constexpr("{" + _Q4_BODY + "}")

# q8: an int8 code c is 16 * (c >> 4) + (c & 15); both nibbles decode like q4's (the high one
# signed, the low one unsigned), then one fma joins them: every step is an integer below 256,
# exact in bf16.
ASM_Q8 = tl.constexpr("""
{
.reg .b32 d, t, lo, hi, mag, one, b136, b128, sixteen;
mov.b32 mag, 0x43434343;
mov.b32 one, 0x3F803F80;
mov.b32 b136, 0xC308C308;
mov.b32 b128, 0xC300C300;
mov.b32 sixteen, 0x41804180;
prmt.b32 d, $1, mag, 0x5140;
lop3.b32 lo, d, 0xFF0FFF0F, 0, 0xc0;
shr.u32 t, d, 4;
lop3.b32 hi, t, 0x000F000F, 0x43084308, 0x6a;
fma.rn.bf16x2 hi, hi, one, b136;
fma.rn.bf16x2 lo, lo, one, b128;
fma.rn.bf16x2 $0, hi, sixteen, lo;
}
""")

# Prefill variant: the same codes times their group scales (bf16 pairs), so successive dots chain
# on the accumulator; code * scale is rounded once to bf16 (exact codes, 11-bit fp16 scales).
ASM_Q4S = tl.constexpr("{" + _Q4_BODY + "fma.rn.bf16x2 $0, $0, $3, nz;\nfma.rn.bf16x2 $1, $1, $4, nz;\n}")

# NVFP4 (prepared layout "g16-split8-f16", see quant_nvfp4/kernels.py: byte j of a 16-element
# group holds element j ("A": sign bit 7, E2M1 magnitude bits 1-3) and element 8 + j ("B":
# magnitude bits 4-6, sign bit 0), so both share the group's scale). prmt puts byte 0 and byte 1
# into the high bytes of the two bf16 halves: A's sign then sits on bit 15 and its magnitude on
# bits 9-11, B's magnitude on bits 12-14 and its sign on bit 8. Keeping or moving the sign to bit
# 15 and moving the magnitude to bits 8..6 (two low exponent bits, top mantissa bit) gives
# exactly e2m1 * 2^-126 (0.5 becomes the bf16 subnormal 2^-127: bf16 arithmetic has no
# flush-to-zero); the fma with the block scale pre-multiplied by 2^119 (exact, under bf16's max)
# then gives e2m1 * s * 2^-7 exactly, and the kernel folds 2^7 into the global scale.
ASM_FP4 = tl.constexpr("""
{
.reg .b32 p, q, t, u, z, nz;
mov.b32 z, 0;
mov.b32 nz, 0x80008000;
prmt.b32 p, $2, z, 0x1404;
shr.u32 t, p, 3;
shr.u32 u, p, 6;
shl.b32 q, p, 7;
and.b32 t, t, 0x01C001C0;
and.b32 u, u, 0x01C001C0;
lop3.b32 t, p, 0x80008000, t, 0xea;
lop3.b32 u, q, 0x80008000, u, 0xea;
fma.rn.bf16x2 $0, t, $3, nz;
fma.rn.bf16x2 $1, u, $3, nz;
}
""")

# E4M3 scale byte -> bf16(s * 2^119), exactly: the byte shifted under the bf16 exponent reads as
# s * 2^-120 (E4M3 subnormals become bf16 subnormals with the same factor), then two exact bf16
# multiplies by 2^127 and 2^112 (one would overflow).
ASM_E4M3 = tl.constexpr("""
{
.reg .b32 d, z, c1, c2, nz;
mov.b32 z, 0;
mov.b32 nz, 0x80008000;
mov.b32 c1, 0x7F007F00;
mov.b32 c2, 0x77807780;
prmt.b32 d, $1, z, 0x4140;
shl.b32 d, d, 4;
fma.rn.bf16x2 d, d, c1, nz;
fma.rn.bf16x2 $0, d, c2, nz;
}
""")


@triton.jit
def _biased_to_bf16(u, BIAS: tl.constexpr):
    """Integers u in [0, 2^23) (int32) -> bf16(u - BIAS), exactly, without an int-to-float convert:
    u under the exponent of 2^23 reads as 2^23 + u, then one fp32 subtraction."""
    f = (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)
    return f.to(tl.bfloat16)


@triton.jit
def _int_codes(b, FAST: tl.constexpr):
    """A uint8 tile -> (low-nibble codes, high-nibble codes) as bf16, signed 4-bit, exact."""
    if FAST:
        lo, hi = tl.inline_asm_elementwise(
            ASM_Q4, "=r,=r,r", [b], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2
        )
    else:
        lo = _biased_to_bf16((b & 0xF).to(tl.int32) ^ 8, 8.0)
        hi = _biased_to_bf16((b >> 4).to(tl.int32) ^ 8, 8.0)
    return lo, hi


@triton.jit
def _q8_codes(q, FAST: tl.constexpr):
    """A uint8 tile of int8 codes -> bf16 codes, exact."""
    if FAST:
        c = tl.inline_asm_elementwise(ASM_Q8, "=r,r", [q], dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        c = _biased_to_bf16((q.to(tl.int32) & 0xFF) ^ 0x80, 128.0)
    return c


@triton.jit
def _int4_scaled(b, s_lo, s_hi, FAST: tl.constexpr):
    """A uint8 tile and the two halves' group scales [BN] -> codes * scale as bf16 (one rounding)."""
    if FAST:
        lo, hi = tl.inline_asm_elementwise(
            ASM_Q4S, "=r,=r,r,r,r", [b, s_lo.to(tl.bfloat16)[:, None], s_hi.to(tl.bfloat16)[:, None]],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2
        )
    else:
        c_lo, c_hi = _int_codes(b, FAST)
        lo = (c_lo.to(tl.float32) * s_lo[:, None]).to(tl.bfloat16)
        hi = (c_hi.to(tl.float32) * s_hi[:, None]).to(tl.bfloat16)
    return lo, hi


@triton.jit
def _wide_codes(b, h, SHIFT, FMT: tl.constexpr):
    """q5/q6: a nibble tile plus the matching high bits (already aligned per element) -> bf16."""
    v = (b & 0xF).to(tl.int32) | (((h.to(tl.int32) >> SHIFT) & ((1 << (FMT - 4)) - 1)) << 4)
    HALF: tl.constexpr = 1 << (FMT - 1)
    return _biased_to_bf16(v ^ HALF, HALF * 1.0)


@triton.jit
def _e2m1_f32(c):
    """4-bit E2M1 codes (int32) -> fp32 values, exactly."""
    mag = c & 7
    e = mag >> 1
    m = mag & 1
    # 4 * |e2m1| is 2m when e == 0 and (2 + m) << e otherwise
    four = tl.where(e == 0, 2 * m, (2 + m) << e)
    v = four.to(tl.float32) * 0.25
    return tl.where((c & 8) != 0, -v, v)


@triton.jit
def _fp4_weights(b, s, FAST: tl.constexpr):
    """A uint8 tile and the per-element block scale -> the weights e2m1 * s of elements j and
    8 + j of each byte (g16-split8-f16), bf16.

    FAST: s is bf16(scale * 2^119) and the weights come out times 2^-7; else s is fp32 scale."""
    if FAST:
        lo, hi = tl.inline_asm_elementwise(
            ASM_FP4, "=r,=r,r,r", [b, s], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2
        )
    else:
        a, c = _fp4_codes(b.to(tl.int32))
        lo = (_e2m1_f32(a) * s).to(tl.bfloat16)
        hi = (_e2m1_f32(c) * s).to(tl.bfloat16)
    return lo, hi


@triton.jit
def _fp4_codes(byte):
    """A g16-split8-f16 byte (int32, 0..255) -> the codes (sign bit 3 | magnitude bits 0-2) of its
    elements j and 8 + j (quant_nvfp4.kernels.unpack_byte)."""
    a = ((byte >> 1) & 7) | ((byte >> 4) & 8)
    c = ((byte >> 4) & 7) | ((byte & 1) << 3)
    return a, c


@triton.jit
def _e4m3_scales(sraw, FAST: tl.constexpr):
    """E4M3FN scale bytes (non-negative) -> bf16(s * 2^119) (FAST) or fp32 s, exactly."""
    if FAST:
        s = tl.inline_asm_elementwise(ASM_E4M3, "=r,r", [sraw], dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        v = sraw.to(tl.int32)
        e = (v >> 3) & 0xF
        m = v & 7
        normal = ((e + 120) << 23) | (m << 20)
        s = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True))
    return s


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    # F32 only under TRITON_INTERPRET: its numpy dot multiplies bf16 bit patterns as integers
    if F32:
        d = tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        d = tl.dot(a, b)
    return d


@triton.jit
def _kb_step(acc, kb, w_rows, h_rows, s_rows, x_rows, m_ok, K, s_pre,
             FMT: tl.constexpr, BLOCK_N: tl.constexpr, FAST: tl.constexpr, DOT_F32: tl.constexpr,
             SCALE_W: tl.constexpr, PREFETCHED: tl.constexpr, NV_SG: tl.constexpr = False):
    """acc += W[:, 128 kb : 128 kb + 128] @ X[:, same]^T for one 128-wide K block.

    PREFETCHED: s_pre holds this block's int group scales (loaded blocks ahead by the caller)."""
    j = tl.arange(0, 64)
    if FMT == 16:
        # g16-split8-f16: column j of the low tile is element 16 (j // 8) + j % 8, of the high tile +8
        k_lo = kb * 128 + (j // 8) * 16 + j % 8
        k_hi = k_lo + 8
    else:
        k_lo = kb * 128 + j
        k_hi = k_lo + 64
    x_lo = tl.load(x_rows + k_lo[:, None], mask=m_ok[None, :] & (k_lo[:, None] < K), other=0.0).to(tl.bfloat16)
    x_hi = tl.load(x_rows + k_hi[:, None], mask=m_ok[None, :] & (k_hi[:, None] < K), other=0.0).to(tl.bfloat16)
    if FMT == 8:
        # q8 g32: 128 int8 codes per block, four groups of 32, one dot each
        j32 = tl.arange(0, 32)
        if PREFETCHED:
            s02, s13 = tl.split(tl.reshape(s_pre.to(tl.float32), (BLOCK_N, 2, 2)))
            s0, s2 = tl.split(s02)
            s1, s3 = tl.split(s13)
        for g in tl.static_range(4):
            kg = kb * 128 + g * 32 + j32
            xg = tl.load(x_rows + kg[:, None], mask=m_ok[None, :] & (kg[:, None] < K), other=0.0).to(tl.bfloat16)
            q = tl.load(w_rows + kg[None, :])
            if PREFETCHED:
                if g == 0:
                    sg = s0
                elif g == 1:
                    sg = s1
                elif g == 2:
                    sg = s2
                else:
                    sg = s3
            else:
                sg = tl.load(s_rows + kb * 4 + g).to(tl.float32)
            c = _q8_codes(q, FAST)
            if SCALE_W:
                acc += _dot((c.to(tl.float32) * sg[:, None]).to(tl.bfloat16), xg, DOT_F32)
            else:
                acc += _dot(c, xg, DOT_F32) * sg[:, None]
    elif FMT == 16:
        b = tl.load(w_rows + kb * 64 + j[None, :])
        if NV_SG:
            # each column's block scale gathered from memory (L1) and decoded in the weight tile's
            # own layout, in place of a broadcast + reshape of the [BLOCK_N, 8] decoded scales
            # (NINFER_NV_SG=1, an A/B switch: the dequant kernel's NVFP4 went 4x faster with its
            # flat tile, BENCHMARKS.md thirty-first run)
            s = _e4m3_scales(tl.load(s_rows[:, None] + kb * 8 + j[None, :] // 8), FAST)
        else:
            sraw = tl.load(s_rows[:, None] + kb * 8 + tl.arange(0, 8)[None, :])
            s8 = _e4m3_scales(sraw, FAST)
            s = tl.reshape(tl.broadcast_to(s8[:, :, None], (BLOCK_N, 8, 8)), (BLOCK_N, 64))
        w_lo, w_hi = _fp4_weights(b, s, FAST)
        acc += _dot(w_lo, x_lo, DOT_F32)
        acc += _dot(w_hi, x_hi, DOT_F32)
    else:
        b = tl.load(w_rows + kb * 64 + j[None, :])
        if PREFETCHED:
            s2 = s_pre.to(tl.float32)
        else:
            s2 = tl.load(s_rows[:, None] + kb * 2 + tl.arange(0, 2)[None, :]).to(tl.float32)
        s_lo, s_hi = tl.split(s2)
        if FMT == 4 and SCALE_W:
            w_lo, w_hi = _int4_scaled(b, s_lo, s_hi, FAST)
            acc += _dot(w_lo, x_lo, DOT_F32)
            acc += _dot(w_hi, x_hi, DOT_F32)
        else:
            if FMT == 4:
                c_lo, c_hi = _int_codes(b, FAST)
            else:
                # high-bit plane: (FMT - 4) bits per element, 16 * (FMT - 4) bytes per block
                PER: tl.constexpr = 8 // (FMT - 4)
                NB: tl.constexpr = 64 // PER
                hb = h_rows + kb * (16 * (FMT - 4))
                hb_lo = tl.load(hb + tl.arange(0, NB)[None, :])
                hb_hi = tl.load(hb + NB + tl.arange(0, NB)[None, :])
                hb_lo = tl.reshape(tl.broadcast_to(hb_lo[:, :, None], (BLOCK_N, NB, PER)), (BLOCK_N, 64))
                hb_hi = tl.reshape(tl.broadcast_to(hb_hi[:, :, None], (BLOCK_N, NB, PER)), (BLOCK_N, 64))
                shift = ((j % PER) * (FMT - 4))[None, :]
                c_lo = _wide_codes(b, hb_lo, shift, FMT)
                c_hi = _wide_codes(b >> 4, hb_hi, shift, FMT)
            if SCALE_W:
                acc += _dot((c_lo.to(tl.float32) * s_lo[:, None]).to(tl.bfloat16), x_lo, DOT_F32)
                acc += _dot((c_hi.to(tl.float32) * s_hi[:, None]).to(tl.bfloat16), x_hi, DOT_F32)
            else:
                # both dots issued before either result is read: one wait per block, not two
                d_lo = _dot(c_lo, x_lo, DOT_F32)
                d_hi = _dot(c_hi, x_hi, DOT_F32)
                acc += d_lo * s_lo[:, None] + d_hi * s_hi[:, None]
    return acc


# M, N and the split length vary per call: specializing on them (Triton would for 1 and for
# multiples of 16) only multiplies compilations; K and the strides keep their divisibility facts.
@triton.jit(do_not_specialize=["M", "N", "KB_PER_SPLIT"])
def _qmm_kernel(
    X, W, H, S, G, Y, WS, CNT,
    M, N, K,
    stride_xm, stride_wn, stride_hn, stride_sn, stride_ym,
    KB_PER_SPLIT,
    FMT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    KB_STEP: tl.constexpr,
    FAST: tl.constexpr,
    DOT_F32: tl.constexpr,
    SCALE_W: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr = False,
    NV_SG: tl.constexpr = False,
):
    pdl_prologue(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    # weights and scales are padded to whole row blocks by prepare(): no row masks on loads
    w_rows = W + rn[:, None].to(tl.int64) * stride_wn
    h_rows = H + rn[:, None].to(tl.int64) * stride_hn
    s_rows = S + rn.to(tl.int64) * stride_sn
    x_rows = X + rm[None, :].to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    kb_lo = pid_k * KB_PER_SPLIT
    kb_hi = tl.minimum(kb_lo + KB_PER_SPLIT, tl.cdiv(K, 128))
    if PREFETCH > 0:
        # int group scales feed the accumulator, not the MMA, so Triton's pipeliner leaves their
        # load in the loop, where its whole memory latency stalled every block (measured: q4 at
        # 1.2-1.5 TB/s); here each block's scales are loaded one block ahead. (Two blocks ahead,
        # two carried tiles, makes Triton 3.6 drop its async-copy pipelining of the weights.)
        SG: tl.constexpr = 4 if FMT == 8 else 2
        sg_off = tl.arange(0, SG)[None, :]
        s_len = tl.cdiv(K, 128) * SG
        r0 = tl.load(s_rows[:, None] + kb_lo * SG + sg_off, mask=kb_lo * SG + sg_off < s_len, other=0.0)
        for kb in range(kb_lo, kb_hi):
            nxt = (kb + 1) * SG + sg_off
            r1 = tl.load(s_rows[:, None] + nxt, mask=nxt < s_len, other=0.0)
            acc = _kb_step(acc, kb, w_rows, h_rows, s_rows, x_rows, m_ok, K, r0, FMT, BLOCK_N, FAST, DOT_F32, SCALE_W, True)
            r0 = r1
    else:
        for kb in range(kb_lo, kb_hi, KB_STEP):
            # KB_STEP blocks per trip (the host makes every split a multiple of it): the loop's
            # fixed costs (waits, address updates) amortize over more weights
            for u in tl.static_range(KB_STEP):
                acc = _kb_step(acc, kb + u, w_rows, h_rows, s_rows, x_rows, m_ok, K, acc, FMT, BLOCK_N, FAST, DOT_F32,
                               SCALE_W, False, NV_SG)
    if FMT == 16:
        g = tl.load(G + rn)
        if FAST:
            g = g * 128.0
        acc = acc * g[:, None]
    n_ok = rn < N
    y_ptrs = Y + rm[None, :].to(tl.int64) * stride_ym + rn[:, None]
    out_mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=out_mask)
    else:
        grid_n = tl.num_programs(0)
        tile = pid_m * grid_n + pid_n
        tile_elems = BLOCK_N * BLOCK_M
        offs = (rn[:, None] - pid_n * BLOCK_N) + (rm[None, :] - pid_m * BLOCK_M) * BLOCK_N
        part = WS + (tile.to(tl.int64) * SPLIT_K) * tile_elems
        tl.store(part + pid_k * tile_elems + offs, acc)
        # every thread's partial is stored before the one release below publishes them
        tl.debug_barrier()
        arrived = SY.arrive(CNT + tile)
        if arrived == SPLIT_K - 1:
            SY.acquire_all(arrived)
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for p in range(SPLIT_K):
                total += tl.load(part + p * tile_elems + offs, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=out_mask)
            SY.rearm(CNT + tile)


# --- host side --------------------------------------------------------------------------------------

# Rows are padded to this in prepare() so no weight load needs a row mask; every BLOCK_N used
# (up to 256, the widest prefill block) divides it.
ROW_PAD = 256


@dataclass(frozen=True)
class Config:
    block_n: int
    block_m: int
    split_k: int
    num_warps: int
    num_stages: int
    kb_step: int = 2
    # int formats: scales multiplied into the bf16 weights (dots chain) instead of onto the
    # accumulator after each group's dot (exact codes); the accumulator way costs BM/64 FMAs per
    # weight, which only small M can afford
    scale_w: bool = False
    # int formats with accumulator-side scales: load each block's scales one block ahead
    prefetch: int = 0

    def describe(self) -> str:
        sw = " SW" if self.scale_w else ""
        pf = f" PF{self.prefetch}" if self.prefetch else ""
        return f"BN{self.block_n} BM{self.block_m} SK{self.split_k} KS{self.kb_step} w{self.num_warps} s{self.num_stages}{sw}{pf}"


def pick_config(fmt: int, m: int, n: int, k: int, sm_count: int) -> Config:
    """Block sizes for one launch: measured winners for the registered shapes (tuned.py, H200),
    else these rules (the measured winners' common pattern)."""
    from ninfer_plugins.quant_int.tuned import TUNED

    bucket = "small" if m <= 8 else "16" if m <= 16 else "prefill" if m > 64 else None
    hit = TUNED.get((fmt, n, k, bucket)) if bucket else None
    if hit is not None:
        return Config(*hit)
    n_kb = -(-k // 128)
    if m <= 16:
        block_n = 64
        row_blocks = -(-n // block_n)
        # enough tiles to give every SM several in flight; a split keeps at least 4 K blocks
        split = 1
        while row_blocks * split < 4 * sm_count and n_kb // (split * 2) >= 4 and split < 16:
            split *= 2
        if fmt == Q8 and k >= 4096:
            # q8's 128-byte rows per block: two warps on 32 rows won on every 27B shape
            return Config(32, 16, split, 2, 4, 1, False, 1)
        return Config(block_n, 16, split, 4, 3 if n >= 65536 else 4, 1, False, 1)
    if m <= 64:
        return Config(64, 64 if m > 32 else 32, 1, 4, 4, 1, False, 1)
    return Config(128, 128, 1, 8, 3, 1, True)


class Workspace:
    """Per-device split-K scratch: fp32 partial tiles and zeroed arrival counters.

    Grown only from `reserve` (called at load time), so a CUDA graph never sees an allocation.
    """

    _by_device: dict[torch.device, Workspace] = {}

    def __init__(self, device: torch.device) -> None:
        self.partials = torch.empty(0, dtype=torch.float32, device=device)
        self.counters = torch.zeros(0, dtype=torch.int32, device=device)
        # buffers outgrown after a CUDA graph may have captured them: kept, never freed, so a graph
        # captured before a growth still reads and writes memory that is its own (a growth at an
        # eager warm-up of a later batch bucket must not turn an earlier graph's scratch into
        # someone else's allocation)
        self._retired: list[torch.Tensor] = []

    @classmethod
    def get(cls, device: torch.device) -> Workspace:
        ws = cls._by_device.get(device)
        if ws is None:
            ws = cls._by_device[device] = cls(device)
        return ws

    def ensure(self, partial_elems: int, tiles: int, capturing: bool) -> None:
        """Grow to at least this much at launch time, which a CUDA graph capture cannot do."""
        if self.partials.numel() < partial_elems or self.counters.numel() < tiles:
            if capturing:
                raise RuntimeError("split-K workspace too small inside a CUDA graph: call reserve_workspace at load")
            self.reserve(partial_elems, tiles)

    def reserve(self, partial_elems: int, tiles: int) -> None:
        # growth at least doubles, so the retired buffers stay under the live ones' size
        if self.partials.numel() < partial_elems:
            if self.partials.numel():
                self._retired.append(self.partials)
            size = max(partial_elems, 2 * self.partials.numel())
            self.partials = torch.empty(size, dtype=torch.float32, device=self.partials.device)
        if self.counters.numel() < tiles:
            if self.counters.numel():
                self._retired.append(self.counters)
            self.counters = torch.zeros(max(tiles, 2 * self.counters.numel()), dtype=torch.int32, device=self.counters.device)


@dataclass
class Prepared:
    """A weight in the kernel's layout, rows padded to ROW_PAD."""

    fmt: int
    n: int
    k: int
    qweight: torch.Tensor
    scales: torch.Tensor
    qhigh: torch.Tensor | None = None
    # NVFP4: fp32 [rows] global scale per row
    gscale: torch.Tensor | None = None
    fast: bool = True
    sm_count: int = 132
    # q5: (qweight, qhigh, words) when the CUDA GEMV's prepared high-bit words were made from those
    # tensors (gemv_cu.attach_words / words_of: at load where a winner on words names the shape, or
    # every q5 weight under NINFER_Q5_WORDS=1)
    q5words: tuple | None = None

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def walked_bytes(self) -> int:
        """Bytes a GEMV walks over the rows: codes, q5/q6 bit planes and scales (not the per-row
        NVFP4 global scale, read once a row)."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.qhigh, self.scales) if t is not None)


def row_chunks(p: Prepared, rows_per_trip: int, n_slices: int, ctas: int) -> tuple[int, int]:
    """(chunks, rows per chunk) of a split-K GEMV that streams rows: enough chunks for about
    `ctas` CTAs an SM over all K slices, each chunk whole trips of rows_per_trip."""
    row_blocks = -(-p.n // rows_per_trip)
    want = max(1, (ctas * p.sm_count) // n_slices)
    trips = max(1, -(-row_blocks // want))
    return -(-row_blocks // trips), trips * rows_per_trip


def capturing(x: torch.Tensor) -> bool:
    """Whether x's stream is being captured into a CUDA graph (no allocation may happen)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t.contiguous()
    out = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


def reserve_workspace(p: Prepared, max_m: int = 16) -> None:
    """Size the split-K scratch for every M up to max_m now (load time), not inside a graph."""
    if p.device.type != "cuda":
        return
    ws = Workspace.get(p.device)
    for m in (1, 4, 8):  # pick_gemv answers M = 2..4 alike, and 5..8
        gcfg = pick_gemv(p.fmt, m, p.n, p.k, p.sm_count)
        if gcfg is not None:
            ws.reserve(*gcfg.workspace(p))
    from ninfer_plugins.quant_int import gemv_h2, gemv_kw, gemv_tkw
    from ninfer_plugins.quant_int.tuned import TUNED_KW, TUNED_KW_TRY, TUNED_TKW, TUNED_TKW_TRY

    if p.fmt in gemv_kw.DECODES:
        _reserve_walk(ws, p, {**TUNED_KW, **TUNED_KW_TRY}, ("m1", "m4"), gemv_kw.KWConfig,
                      gemv_kw.default_config(p.fmt, p.n, p.k, p.sm_count),
                      lambda: (gemv_kw.x_scratch(p.device, p.fmt, p.k), gemv_kw.ready_counters(p.device)))
    if p.fmt in gemv_tkw.FORMATS and gemv_tkw.TC.HAVE_GLUON:
        _reserve_walk(ws, p, {**TUNED_TKW, **TUNED_TKW_TRY}, ("m1", "m4", "m8"), gemv_tkw.TKWConfig,
                      gemv_tkw.default_config(p.fmt, p.n, p.k, p.sm_count), lambda: gemv_tkw.xq_scratch(p.device, p.k))
    from ninfer_plugins.quant_int import gemv_cu

    if p.fmt in gemv_cu.FORMATS and p.k % 128 == 0:
        # the CUDA GEMV's x pairs (its winners, or NINFER_CU_GEMV switched per launch), where no K-walk config made them
        gemv_kw.x_scratch(p.device, p.fmt, p.k)
        gemv_cu.ready(p)
    gemv_h2.zero_word(p.device)  # a pinned f16x2 config's zero (H2Config.pin), made outside any capture
    for m in sorted({1, 8, min(16, max_m), max_m}):
        cfg = pick_config(p.fmt, m, p.n, p.k, p.sm_count)
        split, _, _ = resolve_split(cfg, p.k)
        if split > 1:
            grid_n, grid_m = -(-p.n // cfg.block_n), -(-m // cfg.block_m)
            ws.reserve(grid_n * grid_m * split * cfg.block_n * cfg.block_m, grid_n * grid_m)


def _reserve_walk(ws: "Workspace", p: Prepared, table: dict, buckets: tuple, make, default, scratch) -> None:
    """A K-walk kernel's scratch for every config a launch may pick, whatever its switch says now
    (an A/B in one process may flip it after load): its measured winners and its default config;
    then its x scratch (scratch()) if any config exists."""
    cfgs = [make(*c) for b in buckets if (c := table.get((p.fmt, p.n, p.k, b)))]
    cfgs += [default] if default is not None else []
    for cfg in cfgs:
        ws.reserve(*cfg.workspace(p))
    if cfgs:
        scratch()


def _tuned_or_default(table: dict, key: tuple, make, enabled: bool, default, trial: dict | None = None,
                      trial_switch: str = ""):
    """A table-dispatched kernel's config: its measured winner for key, else (with its experiment
    switch on) default(), else None. `trial`: candidates that take key's place in `table` while
    the environment's `trial_switch` is 1 (an A/B switch read at each launch)."""
    if trial and key in trial and os.environ.get(trial_switch) == "1":
        table = trial
    hit = table.get(key)
    if hit:
        return make(*hit)
    return default() if enabled else None


def resolve_split(cfg: Config, k: int) -> tuple[int, int, int]:
    """(splits, K blocks per trip, K blocks per split) a launch will use for a K of k."""
    n_kb = -(-k // 128)
    kb_step = cfg.kb_step if n_kb % cfg.kb_step == 0 else 1
    split = max(1, min(cfg.split_k, n_kb // kb_step))
    kb_per_split = -(-n_kb // split)
    kb_per_split = -(-kb_per_split // kb_step) * kb_step
    return -(-n_kb // kb_per_split), kb_step, kb_per_split


# Formats whose untuned shapes take the CUDA-core GEMV at M = 1 (gemv.py): q5, q6 and q8, where
# the GEMV beat the MMA kernel on every measured shape of the 27B and 35B (BENCHMARKS.md, "Decode
# GEMV"); untuned shapes arise from merged projections (linear.merge_rows). Not past
# GEMV_DEFAULT_MAX_N rows: the heads were never timed on the GEMV.
GEMV_DEFAULT_FORMATS: frozenset[int] = frozenset({5, 6, 8})
GEMV_DEFAULT_MAX_N = 65536


def pick_gemv(fmt: int, m: int, n: int, k: int, sm_count: int):
    """pick_decode's config, with its next tile's loads pinned ahead of the math under NINFER_PIN=1
    (an A/B switch, read at each launch: H2Config, KWConfig and TKWConfig's `pin`), a K-walk
    config's tail shares dropped under NINFER_KW_TAIL=0 (an A/B switch read at each launch), and a
    tensor-core K-walk config moved to its cp.async ring of NINFER_TKW_RING stages (2-8, an A/B
    switch read at each launch; where the ring does not fit the config stays; 0 takes a ring
    config back to its register form)."""
    cfg = pick_decode(fmt, m, n, k, sm_count)
    if cfg is not None and os.environ.get("NINFER_PIN") == "1" and hasattr(cfg, "pin"):
        cfg = dataclasses.replace(cfg, pin=True)
    if cfg is not None and getattr(cfg, "tail", 0) and os.environ.get("NINFER_KW_TAIL") == "0":
        cfg = dataclasses.replace(cfg, tail=0, tail_splits=0)
    ring = os.environ.get("NINFER_TKW_RING")
    if ring and cfg is not None and hasattr(cfg, "ring"):
        from ninfer_plugins.quant_int import gemv_tkw

        try:
            stages = int(ring)
        except ValueError:
            raise ValueError(f"NINFER_TKW_RING={ring!r}: give the ring's stages, 2-8") from None
        moved = dataclasses.replace(cfg, ring=stages)
        if gemv_tkw._fits(fmt, k, moved):
            cfg = moved
    return cfg


def pick_decode(fmt: int, m: int, n: int, k: int, sm_count: int):
    """The decode kernel for an M <= 8 launch: a tensor-core GEMV config (gemv_tc.py), an f16x2
    GEMV config (gemv_h2.py), a CUDA-core GEMV config (gemv.py), or None where the MMA kernel is
    the faster one. Every config kind launches with `.run(x2, p, fast)` and sizes its scratch
    with `.workspace(p)`.

    Order: for q4/q5/q6/q8/NVFP4 at M <= 4 a measured CUDA C++ GEMV winner (tuned.TUNED_CU, gemv_cu.py, where
    nvcc can build it; NINFER_CU_GEMV=0/1/4 to change); for q4/q5 a measured tensor-core K-walk winner (tuned.TUNED_TKW, M <= 8, unless
    NINFER_TKW=0), and with NINFER_TKW=1 (an experiment) that kernel (gemv_tkw.py) wherever it
    fits; at M <= 4 a measured K-walk winner (tuned.TUNED_KW, unless NINFER_KW=0), and with
    NINFER_KW=1 (an experiment) the K-walk GEMV (gemv_kw.py) wherever it fits; a measured
    tensor-core winner (tuned.TUNED_TC, M <= 8, while NINFER_TC is not 0);
    then for M <= 4 (the f16x2 steps only while NINFER_H2 is not 0): a measured f16x2 winner
    (tuned.TUNED_H2); at M = 1 with no TUNED_H2 entry, the f16x2 GEMV's default for q4/q5/q6/q8
    and NVFP4 (it beat everything else on every 27B/35B shape measured, BENCHMARKS.md "f16x2
    GEMV"); a
    measured CUDA-core winner (TUNED_GEMV); gemv.py's rules. A () entry in either table means
    that kernel lost there."""
    if m > 8:
        return None
    from ninfer_plugins.quant_int import gemv, gemv_cu, gemv_h2, gemv_kw, gemv_tc, gemv_tkw
    from ninfer_plugins.quant_int.tuned import (TUNED_GEMV, TUNED_H2, TUNED_KW, TUNED_KW_TRY, TUNED_TC, TUNED_TKW,
                                                TUNED_TKW_TRY)

    if fmt in gemv_cu.FORMATS and gemv_cu.enabled(m):
        # the CUDA C++ GEMV: its measured winners (tuned.TUNED_CU) ahead of every other kernel;
        # NINFER_CU_GEMV=1 (M = 1) or =4 (M = 1-4) everywhere it applies, =0 never
        cfg = gemv_cu.pick(fmt, m, n, k)
        if cfg is not None:
            return cfg
    if fmt in gemv_tkw.FORMATS and gemv_tkw.tuned_allowed():
        # the tensor-core K-walk: its measured winner (unless NINFER_TKW=0; under NINFER_TKW_TRY=1
        # a candidate of TUNED_TKW_TRY first); with NINFER_TKW=1 (an experiment) its default config
        # wherever it fits, ahead of every other kernel
        tkw_key = (fmt, n, k, "m1" if m == 1 else "m4" if m <= 4 else "m8")
        cfg = _tuned_or_default(TUNED_TKW, tkw_key, gemv_tkw.TKWConfig, gemv_tkw.enabled(),
                                lambda: gemv_tkw.default_config(fmt, n, k, sm_count), TUNED_TKW_TRY, "NINFER_TKW_TRY")
        if cfg is not None:
            return cfg
    if m <= 4 and fmt in gemv_kw.DECODES and gemv_kw.tuned_allowed():
        # the K-walk GEMV: likewise (NINFER_KW=0 / =1; NINFER_KW_TRY=1: TUNED_KW_TRY's candidate
        # first), ahead of every other winner
        cfg = _tuned_or_default(TUNED_KW, (fmt, n, k, "m1" if m == 1 else "m4"), gemv_kw.KWConfig, gemv_kw.enabled(),
                                lambda: gemv_kw.default_config(fmt, n, k, sm_count), TUNED_KW_TRY, "NINFER_KW_TRY")
        if cfg is not None:
            return cfg
    tc_key = (fmt, n, k, "m1" if m == 1 else "m4" if m <= 4 else "m8")
    if gemv_tc.enabled() and os.environ.get("NINFER_TCD") == "1" and fmt in gemv_tc.FORMATS:
        # experiment switch (set before the model loads: workspace is reserved then): the direct
        # tensor-core kernel everywhere it applies, its tuned winner where there is one
        hit = TUNED_TC.get(tc_key)
        cfg = gemv_tc.TCConfig(*hit) if hit and len(hit) == 5 and hit[4] else gemv_tc.direct_default(fmt, n, k)
        if cfg is not None:
            return cfg
    if gemv_tc.enabled():
        hit = TUNED_TC.get(tc_key)
        if hit:
            return gemv_tc.TCConfig(*hit)
    if m > 4:
        return None
    key = (fmt, n, k, "m1" if m == 1 else "m4")
    if gemv_h2.enabled():
        hit = TUNED_H2.get(key)
        if hit:
            return gemv_h2.H2Config(*hit)
        if m == 1 and hit is None and fmt in gemv_h2.DECODES:
            cfg = gemv_h2.default_config(fmt, n, k)
            if cfg is not None:
                return cfg
    hit = TUNED_GEMV.get(key)
    if hit is not None:
        return gemv.GemvConfig(*hit) if hit else None
    if m == 1 and fmt in GEMV_DEFAULT_FORMATS and n <= GEMV_DEFAULT_MAX_N:
        return gemv.default_config(fmt, n, k, sm_count)
    return None


def launch(x2: torch.Tensor, p: Prepared, cfg: Config | None = None, fast: bool | None = None) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T for a prepared weight; x2 must be contiguous in its last dim."""
    m = x2.shape[0]
    if cfg is None:
        gcfg = pick_gemv(p.fmt, m, p.n, p.k, p.sm_count)
        if gcfg is not None:
            return gcfg.run(x2, p, fast)
    cfg = cfg or pick_config(p.fmt, m, p.n, p.k, p.sm_count)
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    grid_n = -(-p.n // cfg.block_n)
    grid_m = -(-m // cfg.block_m)
    split, kb_step, kb_per_split = resolve_split(cfg, p.k)
    if split > 1:
        ws = Workspace.get(x2.device)
        ws.ensure(grid_n * grid_m * split * cfg.block_n * cfg.block_m, grid_n * grid_m, capturing(x2))
        partials, counters = ws.partials, ws.counters
    else:
        partials, counters = y, y  # unused
    qhigh = p.qhigh if p.qhigh is not None else p.qweight
    gscale = p.gscale if p.gscale is not None else p.scales
    _qmm_kernel[(grid_n, grid_m, split)](
        x2, p.qweight, qhigh, p.scales, gscale, y, partials, counters,
        m, p.n, p.k,
        x2.stride(0), p.qweight.stride(0), qhigh.stride(0), p.scales.stride(0), y.stride(0),
        kb_per_split,
        FMT=p.fmt,
        BLOCK_N=cfg.block_n,
        BLOCK_M=cfg.block_m,
        SPLIT_K=split,
        KB_STEP=kb_step,
        FAST=(p.fast if fast is None else fast) and not interpreting(),
        DOT_F32=interpreting(),
        SCALE_W=cfg.scale_w,
        PREFETCH=1 if (cfg.prefetch and p.fmt != NVFP4 and not cfg.scale_w and kb_step == 1) else 0,
        NV_SG=p.fmt == NVFP4 and os.environ.get("NINFER_NV_SG", "0") != "0",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_kwargs(x2.device),
    )
    return y
