"""Dequantize + GEMV in packed half precision (f16x2), for decode (M = 1..4 activation rows).

Why: Nsight Compute on the H200 (BENCHMARKS.md, "Where the decode kernels' time goes") showed gemv.py's q4
kernel issue-bound, not memory-bound: 0.74 instructions issued per scheduler-cycle (of 1.0), DRAM
at 38%, about 6.6 SASS instructions per weight. At 4.25 bits a weight the H200's copy bandwidth
leaves about 3.7 instructions a weight at full issue; this kernel spends about 2.3 (q4).

How (per thread, per 16-byte run of four packed 32-bit words, the prepared "kb128-v1" layout read
as it is):
* Decode with the fp16 magic-number trick, two weights per instruction pair: `lop3` keeps two
  codes in the mantissas of an f16x2 whose exponent reads 1024 (and flips the sign bit of each
  code: u ^ 8 = code + 8), `sub.f16x2` removes 1024 + 8 exactly. A word's low nibbles (K group
  2 kb) and high nibbles (group 2 kb + 1, decoded in place as 16 x code) give four f16x2 registers.
  q5/q6 take their extra bits from the high plane, merged under each pair's lanes by one more
  `lop3`: q5 from its run's bits spread once (`x | x << 14`) and shifted per word, q6 from one
  integer multiply a pair. q8: `prmt` puts two bytes under the exponent byte 0x64.
* Multiply-accumulate with `fma.rn.f16x2` against x pairs prepared once per CTA, chained over the
  run's four words (eight products a lane), then widened to fp32 and scaled by the fp16 group
  scales in fp32.
* Overflow: x is multiplied by a power of two per CTA and row (from the slice's max |x|) so that
  the worst case of a lane's eight products stays under 2^15; undone exactly at the end. The
  smallest x that still counts is then about 2^-24 of the largest: nothing a bf16 result sees.
* Work split: a CTA owns one K slice (KBS blocks of 128) and a chunk of rows, prepares its x pairs
  once and streams the chunk's rows (BLOCK_N a trip, the next trip's words loaded before this
  trip's math when PREFETCH). Each slice writes fp32 partials; the last CTA of a row chunk to
  arrive (an atomic counter, reset by it) sums the slices in a fixed order: bit-reproducible,
  one launch, CUDA-graph safe. Needs K % (128 KBS) == 0 (every registered shape has it).
* Several activation rows (M <= 4, speculative verify): one decode, M chains; output lane m of
  each run's four is row m's partial, so one reduction serves every row.

* NVFP4 (format 16, quant_nvfp4's "g16-split8-f16" layout; dispatched at M = 1 since the H200 check of
  2026-12-03, see DECODES): an E2M1
  code's sign and three magnitude bits go under an f16's sign, exponent and top mantissa bits by
  shifts, which is the code's value times 2^-14, exactly (subnormals included); a run's two E4M3
  block scales the same way (value times 2^-8); a word's eight products chain per block; the
  2^-22 is undone with x's scaling and the row's fp32 global scale applied in the final sum.

Under TRITON_INTERPRET=1 the same tiles are decoded with plain integer arithmetic and summed in
fp32 (x rounded to fp16 after the same power-of-two scaling); tests run the PTX strings in an
emulator over every code (tests/plugins/quant_int/test_gemv_h2.py, test_gemv_h2_nvfp4.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer_plugins.quant_int import kernels as QK
from ninfer.kernels.triton import prefetch as PF
from ninfer.kernels.triton import sync as SY
from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue

MAX_M = 4
# the int formats; DECODES, every format this kernel decodes (and the dispatch sends here), adds
# NVFP4 (checked on the H200: test_gemv_h2_nvfp4.py, 2026-12-03)
FORMATS = (4, 5, 6, 8)
NVFP4 = 16
DECODES = (*FORMATS, NVFP4)
# log2 of the largest |x| after scaling, per format: 8 products a lane of |code| <= 2^(bits-1)
# (q4 8, q5 16, q6 32, q8 128) times 2^(HEAD + 1) stays <= 2^15. NVFP4: x's f16 pairs must
# stay finite (|x| < 2^15) and a block's 16 products are at most 6 * 2^-14 * 2^15 each
HEAD = {4: 8, 5: 7, 6: 6, 8: 4, 16: 14}
# 32-bit words of packed codes per 128-element K block, and of the q5/q6 high plane
WORDS = {4: 16, 5: 16, 6: 16, 8: 32, 16: 16}
HWORDS = {5: 4, 6: 8}
# NVFP4: an E2M1 code decodes to its value times 2^-14 (its three magnitude bits under an f16's
# exponent and mantissa: exact, subnormals included) and an E4M3 scale to its value times 2^-8
# (its seven bits under an f16's): the fast path's sums carry 2^-22, undone with x's scaling
NVFP4_UNDO = 22


def _word_asm(fmt: int, j: int) -> list[str]:
    """PTX decoding word j of a run (operand $W{j}) into the f16x2 registers pa, pb, pc, pd
    (q8: pa, pc): pa/pc lanes are low-nibble codes (pa: bytes 0 and 2, pc: bytes 1 and 3), pb/pd
    the high-nibble codes times 16. NVFP4: see _word_asm_nvfp4."""
    w = f"%W{j}"
    if fmt == NVFP4:
        return _word_asm_nvfp4(w)
    if fmt == 8:
        return [
            f"prmt.b32 pa, {w}, 0x64646464, 0x4240;",
            f"prmt.b32 pc, {w}, 0x64646464, 0x4341;",
            "xor.b32 pa, pa, 0x00800080;",
            "xor.b32 pc, pc, 0x00800080;",
            "sub.f16x2 pa, pa, kb;",
            "sub.f16x2 pc, pc, kb;",
        ]
    if fmt == 5:
        return _word_asm_q5(j)
    out = [f"shr.b32 w8, {w}, 8;"]
    if fmt == 4:
        out += [
            f"lop3.b32 pa, {w}, 0x000F000F, 0x64086408, 0x6a;",
            f"lop3.b32 pb, {w}, 0x00F000F0, 0x64806480, 0x6a;",
            "lop3.b32 pc, w8, 0x000F000F, 0x64086408, 0x6a;",
            "lop3.b32 pd, w8, 0x00F000F0, 0x64806480, 0x6a;",
        ]
    else:
        # q6 (q5 has its own, _word_asm_q5): u = this word's four elements' two high bits each,
        # low and high group; one multiply puts a pair's bits under both of its lanes
        mask_ac, mask_bd, mag_ac, mag_bd = "0x00300030", "0x03000300", "0x64206420", "0x66006600"
        mul = {"a": (1 << 4) + (1 << 16), "c": (1 << 2) + (1 << 14), "b": (1 << 8) + (1 << 20), "d": (1 << 6) + (1 << 18)}
        if j == 0:
            out += ["and.b32 ul, %HL, 255;", "and.b32 uh, %HH, 255;"]
        else:
            out += [f"shr.b32 ul, %HL, {8 * j};", "and.b32 ul, ul, 255;",
                    f"shr.b32 uh, %HH, {8 * j};", "and.b32 uh, uh, 255;"]
        for reg, src, u, nmask, mag, hmask in (
            ("pa", w, "ul", "0x000F000F", mag_ac, mask_ac),
            ("pb", w, "uh", "0x00F000F0", mag_bd, mask_bd),
            ("pc", "w8", "ul", "0x000F000F", mag_ac, mask_ac),
            ("pd", "w8", "uh", "0x00F000F0", mag_bd, mask_bd),
        ):
            out += [
                f"mul.lo.u32 hb, {u}, {mul[reg[1]]};",
                f"lop3.b32 t1, {src}, {nmask}, {mag}, 0xea;",
                f"lop3.b32 {reg}, hb, {hmask}, t1, 0x6a;",
            ]
    out += ["sub.f16x2 pa, pa, ka;", "sub.f16x2 pb, pb, kb;", "sub.f16x2 pc, pc, kc;", "sub.f16x2 pd, pd, kd;"]
    return out


def _word_asm_nvfp4(w: str) -> list[str]:
    """NVFP4 ("g16-split8-f16", quant_nvfp4.kernels.pack_byte: byte i holds element i of its
    8-element half-block as "A" (sign bit 7, magnitude bits 1-3) and element 8 + i as "B"
    (magnitude bits 4-6, sign bit 0)): pa = A of bytes 0 and 2, pb their B, pc / pd the same for
    bytes 1 and 3. Each lane becomes the f16 with the code's sign on bit 15 and its magnitude on
    bits 9-11, which is the E2M1 value times 2^-14. Ten instructions: bytes 1 and 3's A already sit
    there (one AND); bytes 0 and 2's A one byte lower (a shift and an AND); their B go with one
    multiply by 2^5 + 2^15, whose cross terms (bits 5 and 19-22) the AND drops and whose one
    overlap (bit 21) carries only into bit 22; bytes 1 and 3's B need a right shift for the
    magnitude and a left one for the sign."""
    return [
        f"shl.b32 t1, {w}, 8;",
        "and.b32 pa, t1, 0x8E008E00;",
        f"and.b32 pc, {w}, 0x8E008E00;",
        f"and.b32 t1, {w}, 0x00710071;",
        "mul.lo.u32 t1, t1, 0x00008020;",
        "and.b32 pb, t1, 0x8E008E00;",
        f"shr.b32 t1, {w}, 3;",
        "and.b32 t1, t1, 0x0E000E00;",
        f"shl.b32 hb, {w}, 7;",
        "lop3.b32 pd, hb, 0x80008000, t1, 0xea;",
    ]


def _nvfp4_scales() -> list[str]:
    """NVFP4, once a run: %S's bytes 0 and 1 (the E4M3 scales of the run's two 16-element blocks)
    into the f16 pair sa (block 0 in the low half): each scale's 7 bits under an f16's, its value
    times 2^-8."""
    return ["prmt.b32 sa, %S, 0, 0x4140;",  # byte 0 -> bits 0-7, byte 1 -> bits 16-23
            "shl.b32 t1, sa, 7;", "and.b32 t1, t1, 0x3F803F80;", "shl.b32 hb, sa, 8;",
            "lop3.b32 sa, hb, 0x80008000, t1, 0xea;"]


def _q5_run_prologue() -> list[str]:
    """q5, once a run: sa / sb = the run's 16 low- / high-group bits h (element 4j + i of the run
    on bit 4j + i), OR'd with themselves 14 places up. Then for word j, sa >> (4j - 4) holds
    element 4j on bit 4, 4j + 1 on bit 5, 4j + 2 on bit 20 and 4j + 3 on bit 21: the lanes of the
    pairs (0, 2) and (1, 3); sb >> (4j - 8) the same on bits 8, 9, 24, 25. (Bits 14 and 15, where
    the two copies overlap, are never read.)"""
    out = []
    for src, dst in (("%HL", "sa"), ("%HH", "sb")):
        out += [f"shr.b32 {dst}, {src}, %SH;", f"and.b32 {dst}, {dst}, 0xFFFF;", f"shl.b32 t1, {dst}, 14;",
                f"or.b32 {dst}, {dst}, t1;"]
    return out


def _shift(dst: str, src: str, right: int) -> str:
    if right == 0:
        return f"mov.b32 {dst}, {src};"
    return f"shr.b32 {dst}, {src}, {right};" if right > 0 else f"shl.b32 {dst}, {src}, {-right};"


def _word_asm_q5(j: int) -> list[str]:
    """q5, word j of a run: nibbles from the word (pa: low nibbles of bytes 0, 2 on bits 0-3; pb:
    their high nibbles in place, x16) and from the word >> 7 (pc: low nibbles of bytes 1, 3 on
    bits 1-4, x2; pd: their high nibbles on bits 5-8, x32); each pair's fifth bit sits right
    above its nibble (flipped: u ^ 16 = code + 16), so a lane reads 1024 + k (code + 16) for
    k = 1, 16, 2, 32; x's pairs carry 1/k."""
    w = f"%W{j}"
    out = [f"shr.b32 w8, {w}, 7;", _shift("ul", "sa", 4 * j - 4), _shift("uh", "sb", 4 * j - 8)]
    out += q5_pair_lines(w)
    out += ["sub.f16x2 pa, pa, ka;", "sub.f16x2 pb, pb, kb;", "sub.f16x2 pc, pc, kc;", "sub.f16x2 pd, pd, kd;"]
    return out


def q5_pair_lines(w: str) -> list[str]:
    """q5: the four biased f16x2 pairs of word `w` (and w8 = w >> 7) with their fifth bits from
    ul / uh (elements 4j, 4j+1 on bits 4, 5 and 20, 21 of ul; the high group's on 8, 9, 24, 25
    of uh); gemv_tc.py shares it."""
    out = []
    for reg, src, u, nmask, mag, hmask in (
        ("pa", w, "ul", "0x000F000F", "0x64106410", "0x00100010"),
        ("pc", "w8", "ul", "0x001E001E", "0x64206420", "0x00200020"),
        ("pb", w, "uh", "0x00F000F0", "0x65006500", "0x01000100"),
        ("pd", "w8", "uh", "0x01E001E0", "0x66006600", "0x02000200"),
    ):
        out += [f"lop3.b32 t1, {src}, {nmask}, {mag}, 0xea;", f"lop3.b32 {reg}, {u}, {hmask}, t1, 0x6a;"]
    return out


# the f16x2 constants each format's decode subtracts from pa, pb, pc, pd
_SUB = {4: ("0x64086408", "0x64806480", "0x64086408", "0x64806480"),
        5: ("0x64106410", "0x65006500", "0x64206420", "0x66006600"),
        6: ("0x64206420", "0x66006600", "0x64206420", "0x66006600"),
        8: ("0x64806480", "0x64806480", "0x64806480", "0x64806480")}
# what x's pairs A, B, C, D are multiplied by (besides the power-of-two scaling), so that each
# lane's product is code * x: 1 / (the factor the decode leaves on the code)
X_FACTORS = {4: (1.0, 0.0625, 1.0, 0.0625), 5: (1.0, 0.0625, 0.5, 0.03125), 6: (1.0, 0.0625, 1.0, 0.0625),
             8: (1.0, 1.0, 1.0, 1.0), 16: (1.0, 1.0, 1.0, 1.0)}
# where a word's high-nibble elements sit, after its low ones: the next 64 (the K block's second
# group, int formats) or the next 8 (the other half of NVFP4's 16-element block)
HI_OFFSET = {4: 64, 5: 64, 6: 64, 8: 64, 16: 8}


def dot_asm(fmt: int, block_m: int) -> tuple[str, int]:
    """The inline PTX of one run (four words) for `block_m` activation rows, and its input count
    (tensors of four registers each). Operands, in order: outputs $0..$3 (fp32: $m is row m's
    partial, zero past block_m); the four words; for q5/q6 the low- and high-group bit words
    (q6: shifted to this run; q5: as loaded, with the shift to the run next); the scales (q4-q6: an int32 holding the fp16 pair (group 2kb,
    2kb+1); q8: fp32); then per row the x pairs A, C (q8) or A, B, C, D (others)."""
    names: list[str] = [f"W{j}" for j in range(4)]
    if fmt in (5, 6):
        names += ["HL"] + ["_"] * 3 + ["HH"] + ["_"] * 3
    if fmt == 5:
        names += ["SH"] + ["_"] * 3
    names += ["S"] + ["_"] * 3
    parts = ("A", "C") if fmt == 8 else ("A", "B", "C", "D")
    for m in range(block_m):
        for part in parts:
            names += [f"X{part}{m}_{j}" for j in range(4)]
    reg = {name: f"${4 + i}" for i, name in enumerate(names) if name != "_"}
    n_inputs = len(names) // 4
    lines = [
        "{",
        ".reg .b32 w8, pa, pb, pc, pd, ul, uh, hb, t1, sa, sb, ka, kb, kc, kd;",
        ".reg .b32 " + ", ".join(f"al{m}, ah{m}" for m in range(block_m)) + ";",
        ".reg .b16 h0, h1;",
        ".reg .f32 f0, f1, s0, s1, lo, hi;",
    ]
    if fmt in _SUB:  # the int formats' magic-number bias (NVFP4 decodes without one)
        lines += [f"mov.b32 k{r}, {_SUB[fmt][i]};" for i, r in enumerate("abcd")]
    if fmt == 5:
        lines += _q5_run_prologue()
    for m in range(block_m):
        lines += [f"mov.b32 al{m}, 0;", f"mov.b32 ah{m}, 0;"]
    for j in range(4):
        lines += _word_asm(fmt, j)
        for m in range(block_m):
            if fmt == NVFP4:
                # a word's eight codes share one block scale: words 0-1 chain into al (block 0 of
                # the run), 2-3 into ah (block 1)
                acc = f"al{m}" if j < 2 else f"ah{m}"
                lines += [f"fma.rn.f16x2 {acc}, {reg}, %X{part}{m}_{j}, {acc};"
                          for reg, part in (("pa", "A"), ("pc", "C"), ("pb", "B"), ("pd", "D"))]
                continue
            lines += [f"fma.rn.f16x2 al{m}, pa, %XA{m}_{j}, al{m};", f"fma.rn.f16x2 al{m}, pc, %XC{m}_{j}, al{m};"]
            if fmt != 8:
                lines += [f"fma.rn.f16x2 ah{m}, pb, %XB{m}_{j}, ah{m};", f"fma.rn.f16x2 ah{m}, pd, %XD{m}_{j}, ah{m};"]
    if fmt == 8:
        lines += ["mov.b32 s0, %S;"]
    elif fmt == NVFP4:
        lines += _nvfp4_scales() + ["mov.b32 {h0, h1}, sa;", "cvt.f32.f16 s0, h0;", "cvt.f32.f16 s1, h1;"]
    else:
        lines += ["mov.b32 {h0, h1}, %S;", "cvt.f32.f16 s0, h0;", "cvt.f32.f16 s1, h1;"]
    for m in range(4):
        if m >= block_m:
            lines.append(f"mov.b32 ${m}, 0;")
            continue
        lines += [f"mov.b32 {{h0, h1}}, al{m};", "cvt.f32.f16 f0, h0;", "cvt.f32.f16 f1, h1;", "add.f32 lo, f0, f1;"]
        if fmt == 8:
            lines.append(f"mul.f32 ${m}, lo, s0;")
        else:
            lines += [f"mov.b32 {{h0, h1}}, ah{m};", "cvt.f32.f16 f0, h0;", "cvt.f32.f16 f1, h1;", "add.f32 hi, f0, f1;",
                      "mul.f32 lo, lo, s0;", f"fma.rn.f32 ${m}, hi, s1, lo;"]
    lines.append("}")
    text = "\n".join(lines)
    for name, r in sorted(reg.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"%{name}", r)
    return text, n_inputs


@triton.jit
def _pair(lo, hi, FAST: tl.constexpr):
    """Two fp32 tensors -> int32 holding f16x2 (lo in bits 0..15), round to nearest."""
    if FAST:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        a = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        b = hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        return a | (b << 16)


@triton.jit
def _bx(x, like):
    """x [C] (or [C, 1]) -> the word tile's shape [C, BLOCK_N]."""
    if len(x.shape) == 1:
        return tl.broadcast_to(x[:, None], like.shape)
    else:
        return tl.broadcast_to(x, like.shape)


@triton.jit
def _pow2(e):
    """2^e as fp32 for integer tensors e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _xval(X, xr, ok, GOFF, GATED: tl.constexpr):
    """x at the pointers xr as fp32; GATED: silu(xr[..]) * xr[GOFF + ..] rounded once to x's
    dtype, as the separate silu_mul launch would have stored it (gate | up rows, merged)."""
    if GATED:
        g = tl.load(xr, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(xr + GOFF, mask=ok, other=0.0).to(tl.float32)
        return (g * tl.sigmoid(g) * u).to(X.dtype.element_ty).to(tl.float32)
    else:
        return tl.load(xr, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _amax4(a, b, c, d, ROWS: tl.constexpr):
    """max |.| over four tensors: all of it ([C] -> a scalar), or per row (ROWS: [R, C] -> [R, 1])."""
    v = tl.maximum(tl.maximum(tl.abs(a), tl.abs(b)), tl.maximum(tl.abs(c), tl.abs(d)))
    if ROWS:
        return tl.max(v, 1, keep_dims=True)
    else:
        return tl.max(v, 0)


@triton.jit
def _x_scaled(X, m, stride_xm, M, base, FMT: tl.constexpr, HEAD: tl.constexpr, GOFF, GATED: tl.constexpr,
              ROWS: tl.constexpr = False):
    """Row m of x at the word columns' elements (base: each word's byte 0, low group; the high
    group HI_OFFSET later; q8 has none): l0..l3, h0..h3 as fp32 (zeros past M); the power of two
    e that brings their max |x| under 2^(HEAD + 1), and the factors of the pairs A, B, C, D
    (2^e times 1 / the factor each pair's decode leaves on its codes, X_FACTORS). gemv_kw.py's
    x pairs share it. GATED: x is silu(gate) * up of a row [gate | up] whose up half starts GOFF
    elements after the gate's. ROWS: base is [K blocks, word columns], one scaling a K block
    (e and the factors [K blocks, 1]); else [word columns] of one block (scalars)."""
    ok = (base * 0 + m) < M
    xr = X + m * stride_xm + base
    l0 = _xval(X, xr + 0, ok, GOFF, GATED)
    l1 = _xval(X, xr + 1, ok, GOFF, GATED)
    l2 = _xval(X, xr + 2, ok, GOFF, GATED)
    l3 = _xval(X, xr + 3, ok, GOFF, GATED)
    amax = _amax4(l0, l1, l2, l3, ROWS)
    if FMT != 8:
        HI: tl.constexpr = 8 if FMT == 16 else 64  # HI_OFFSET
        h0 = _xval(X, xr + HI, ok, GOFF, GATED)
        h1 = _xval(X, xr + HI + 1, ok, GOFF, GATED)
        h2 = _xval(X, xr + HI + 2, ok, GOFF, GATED)
        h3 = _xval(X, xr + HI + 3, ok, GOFF, GATED)
        amax = tl.maximum(amax, _amax4(h0, h1, h2, h3, ROWS))
    else:
        h0 = l0
        h1 = l1
        h2 = l2
        h3 = l3
    ex = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = HEAD - tl.minimum(tl.maximum(ex, -100), 100)
    f = _pow2(e)
    if FMT == 16:
        fb = f
    else:
        fb = f * 0.0625
    if FMT == 5:
        fc = f * 0.5
        fd = f * 0.03125
    else:
        fc = f
        fd = fb
    return l0, l1, l2, l3, h0, h1, h2, h3, e, f, fb, fc, fd


@triton.jit
def _xrow_prep(X, m, stride_xm, M, base, FMT: tl.constexpr, HEAD: tl.constexpr, FAST: tl.constexpr,
               GOFF, GATED: tl.constexpr):
    """Row m of x over this CTA's slice, per word column: the fast path's f16x2 pairs A, B, C, D
    (int32 [C]; four more copies to keep one return signature), or the scaled x values (lo0..lo3,
    hi0..hi3 as fp32, rounded to fp16 as the pairs are); and 1/scale (_x_scaled)."""
    l0, l1, l2, l3, h0, h1, h2, h3, e, f, fb, fc, fd = _x_scaled(X, m, stride_xm, M, base, FMT, HEAD, GOFF, GATED)
    inv = _pow2(-e)
    if FAST:
        if FMT == 16:
            # the decode's 2^-22 (NVFP4_UNDO) is undone with the scaling
            inv = _pow2(22 - e)
        xa = _pair(l0 * f, l2 * f, FAST)
        xc = _pair(l1 * fc, l3 * fc, FAST)
        xb = _pair(h0 * fb, h2 * fb, FAST)
        xd = _pair(h1 * fd, h3 * fd, FAST)
        return xa, xb, xc, xd, xa, xb, xc, xd, inv
    else:
        return ((l0 * f).to(tl.float16).to(tl.float32), (l1 * f).to(tl.float16).to(tl.float32),
                (l2 * f).to(tl.float16).to(tl.float32), (l3 * f).to(tl.float16).to(tl.float32),
                (h0 * f).to(tl.float16).to(tl.float32), (h1 * f).to(tl.float16).to(tl.float32),
                (h2 * f).to(tl.float16).to(tl.float32), (h3 * f).to(tl.float16).to(tl.float32), inv)


@triton.jit
def _plain_codes(w, i, hl, hh, j, FMT: tl.constexpr):
    """Interpreter path: byte i of each word -> (low-group code, high-group code) as fp32
    (q8: the byte's code twice). j: the word's place in its run (for the q5/q6 bit words)."""
    byte = (w >> (8 * i)) & 0xFF
    if FMT == 8:
        c = ((byte ^ 0x80) - 0x80).to(tl.float32)
        return c, c
    if FMT == 16:
        a, c = QK._fp4_codes(byte)
        return QK._e2m1_f32(a), QK._e2m1_f32(c)
    lo = byte & 0xF
    hi = (byte >> 4) & 0xF
    if FMT == 4:
        return ((lo ^ 8) - 8).to(tl.float32), ((hi ^ 8) - 8).to(tl.float32)
    W: tl.constexpr = FMT - 4
    MASK: tl.constexpr = (1 << W) - 1
    HALF: tl.constexpr = 1 << (FMT - 1)
    sh = (j * 4 + i) * W
    ul = lo | (((hl >> sh) & MASK) << 4)
    uh = hi | (((hh >> sh) & MASK) << 4)
    return ((ul ^ HALF) - HALF).to(tl.float32), ((uh ^ HALF) - HALF).to(tl.float32)


@triton.jit
def _e4m3(b):
    """Interpreter path: E4M3 bytes (int) -> their values (fp32), sign included (kernels'
    _e4m3_scales takes non-negative scales only); NaN never occurs in a scale."""
    e = (b >> 3) & 15
    m = (b & 7).to(tl.float32)
    v = tl.where(e == 0, m * 0.001953125, (8.0 + m) * _pow2(e - 10))
    return tl.where((b & 0x80) != 0, -v, v)


@triton.jit
def _plain_scales(s, jj, FMT: tl.constexpr):
    """Interpreter path: a word tile's scales as loaded -> (low-group, high-group) fp32 values.
    jj: each word's place in its run."""
    if FMT == 8:
        s_lo = s.to(tl.float32)
        s_hi = s_lo
    elif FMT == 16:
        # a word's codes share its 16-element block's scale: byte (word in run) // 2 of the pair
        s_lo = _e4m3((s.to(tl.int32) >> (8 * (jj // 2))) & 0xFF)
        s_hi = s_lo
    else:
        s_lo = (s & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        s_hi = ((s >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return s_lo, s_hi


@triton.jit
def _plain_row(w, hl, hh, j, s_lo, s_hi, l0, l1, l2, l3, h0, h1, h2, h3, FMT: tl.constexpr):
    """Interpreter path: one activation row against a tile of words -> its [BLOCK_N] sums."""
    a0, b0 = _plain_codes(w, 0, hl, hh, j, FMT)
    a1, b1 = _plain_codes(w, 1, hl, hh, j, FMT)
    a2, b2 = _plain_codes(w, 2, hl, hh, j, FMT)
    a3, b3 = _plain_codes(w, 3, hl, hh, j, FMT)
    lo = a0 * l0[:, None] + a1 * l1[:, None] + a2 * l2[:, None] + a3 * l3[:, None]
    if FMT == 8:
        return tl.sum(lo * s_lo, 0)
    hi = b0 * h0[:, None] + b1 * h1[:, None] + b2 * h2[:, None] + b3 * h3[:, None]
    return tl.sum(lo * s_lo + hi * s_hi, 0)


@triton.jit
def _pin_loads(ON: tl.constexpr):
    """A warp barrier (bar.warp.sync: it orders the warp's memory accesses), so that the next tile's
    loads issued before it stay ahead of this tile's math: without it ptxas moves them to the end
    of the loop body (sm_90 SASS, Triton 3.6), one memory latency a trip. It holds where the math
    loads too (gemv_kw's x operands); math on registers alone can still move above it
    (`_pinned`). A no-op when off (and in the interpreter). gemv_kw shares it."""
    if ON:
        tl.inline_asm_elementwise("bar.warp.sync -1; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pinned(w, ZERO, ON: tl.constexpr):
    """w, made to depend on a load issued after the warp barrier that follows the next tile's
    loads: xor-ed with ZERO[0] (a word that is 0), so the math on w (registers only here: x is
    prepared before the loop) cannot move above those loads. An asm constant would not do: ptxas
    folds it. Costs an L1 hit a trip and one LOP3 a word."""
    if ON:
        _pin_loads(True)
        w = w ^ tl.load(ZERO)
    return w


def zero_word(device: torch.device) -> torch.Tensor:
    """int32 [1] = 0, kept for the life of the process (_pinned reads it; a CUDA graph keeps the
    pointer): made on first use, which reserve_workspace makes at load."""
    from ninfer.kernels.triton.launch import lasting

    return lasting("gemv_zero_word", device, (), lambda: torch.zeros(1, dtype=torch.int32, device=device))


@triton.jit
def _load_tile(wp, sp, hp, h_shift, lead, FMT: tl.constexpr, FAST: tl.constexpr):
    """One trip's words [C, BLOCK_N] (tiles are words-first: every load then has its longest
    contiguity, or a tie, along dim 0 and Triton lays them all out alike, threads along words
    then rows); per word, its run's q5/q6 bit words (shifted to the run) and its scales (q4-q6:
    int32 fp16 pair; q8: fp16). The asm reads those from a run's first word only, so the fast
    path loads them there alone (`lead`), the plain path everywhere."""
    w = tl.load(wp)
    if FAST:
        one = tl.broadcast_to(lead[:, None], w.shape)
        s = tl.load(sp, mask=one, other=0)
    else:
        s = tl.load(sp)
    if FMT == 5 or FMT == 6:
        HOFF: tl.constexpr = 2 if FMT == 5 else 4  # words from a K block's low-group bits to its high
        if FAST:  # as loaded: q6 has one bit word a run, q5's asm shifts to its run once a run
            hl = tl.load(hp, mask=one, other=0)
            hh = tl.load(hp + HOFF, mask=one, other=0)
        else:
            hl = tl.load(hp) >> h_shift[:, None]
            hh = tl.load(hp + HOFF) >> h_shift[:, None]
    else:
        hl = w
        hh = w
    return w, hl, hh, s


@triton.jit
def _dot_out(w, hl, hh, s, h_shift, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1, xa2, xb2, xc2, xd2, xa3, xb3, xc3, xd3,
             FMT: tl.constexpr, BLOCK_M: tl.constexpr, ASM: tl.constexpr, CONSTR: tl.constexpr):
    """The fast path's dot of a word tile [C, BLOCK_N] with x pairs per word ([C] each): fp32
    [C, BLOCK_N] where lane m of each run of four words holds row m's partial of the run (scales
    applied, x's power-of-two scaling not undone). gemv_kw.py shares it."""
    sb = s
    if FMT == 8:
        sb = s.to(tl.float32)
    if FMT == 16:
        sb = s.to(tl.int32)  # the run's two E4M3 bytes (an int16 load)
    # the asm's operands are fixed per (FMT, BLOCK_M): see dot_asm
    if FMT == 8:
        if BLOCK_M == 1:
            args = [w, sb, _bx(xa0, w), _bx(xc0, w)]
        elif BLOCK_M == 2:
            args = [w, sb, _bx(xa0, w), _bx(xc0, w), _bx(xa1, w), _bx(xc1, w)]
        else:
            args = [w, sb, _bx(xa0, w), _bx(xc0, w), _bx(xa1, w), _bx(xc1, w),
                    _bx(xa2, w), _bx(xc2, w), _bx(xa3, w), _bx(xc3, w)]
    elif FMT == 4 or FMT == 16:
        if BLOCK_M == 1:
            args = [w, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w)]
        elif BLOCK_M == 2:
            args = [w, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w),
                    _bx(xa1, w), _bx(xb1, w), _bx(xc1, w), _bx(xd1, w)]
        else:
            args = [w, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w),
                    _bx(xa1, w), _bx(xb1, w), _bx(xc1, w), _bx(xd1, w),
                    _bx(xa2, w), _bx(xb2, w), _bx(xc2, w), _bx(xd2, w),
                    _bx(xa3, w), _bx(xb3, w), _bx(xc3, w), _bx(xd3, w)]
    elif FMT == 5:
        shb = tl.broadcast_to(h_shift[:, None], w.shape)
        if BLOCK_M == 1:
            args = [w, hl, hh, shb, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w)]
        elif BLOCK_M == 2:
            args = [w, hl, hh, shb, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w),
                    _bx(xa1, w), _bx(xb1, w), _bx(xc1, w), _bx(xd1, w)]
        else:
            args = [w, hl, hh, shb, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w),
                    _bx(xa1, w), _bx(xb1, w), _bx(xc1, w), _bx(xd1, w),
                    _bx(xa2, w), _bx(xb2, w), _bx(xc2, w), _bx(xd2, w),
                    _bx(xa3, w), _bx(xb3, w), _bx(xc3, w), _bx(xd3, w)]
    else:
        if BLOCK_M == 1:
            args = [w, hl, hh, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w)]
        elif BLOCK_M == 2:
            args = [w, hl, hh, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w),
                    _bx(xa1, w), _bx(xb1, w), _bx(xc1, w), _bx(xd1, w)]
        else:
            args = [w, hl, hh, sb, _bx(xa0, w), _bx(xb0, w), _bx(xc0, w), _bx(xd0, w),
                    _bx(xa1, w), _bx(xb1, w), _bx(xc1, w), _bx(xd1, w),
                    _bx(xa2, w), _bx(xb2, w), _bx(xc2, w), _bx(xd2, w),
                    _bx(xa3, w), _bx(xb3, w), _bx(xc3, w), _bx(xd3, w)]
    out = tl.inline_asm_elementwise(ASM, CONSTR, args, dtype=tl.float32, is_pure=True, pack=4)
    return out


@triton.jit
def _trip(w, hl, hh, s, r0, rn, row_hi, h_shift, jj, cols4, inv, WS, N_SLICES, pid_s,
          xa0, xb0, xc0, xd0, p00, p01, p02, p03, xa1, xb1, xc1, xd1, p10, p11, p12, p13, xa2, xb2, xc2, xd2, p20, p21, p22, p23, xa3, xb3, xc3, xd3, p30, p31, p32, p33,
          FMT: tl.constexpr, BLOCK_M: tl.constexpr, ASM: tl.constexpr, CONSTR: tl.constexpr, FAST: tl.constexpr,
          ABLATE: tl.constexpr = 0):
    """One trip: a tile's partial sums for every x row, stored to the workspace. ABLATE = 1 (a
    measurement, never dispatched: bench/h2_ablate.py) replaces the decode and multiply-adds with
    one xor of the tile's words, keeping the loads, the reduction and the stores."""
    if FAST and ABLATE == 1:
        fold = w ^ hl ^ hh ^ s.to(tl.int32)
        out = fold.to(tl.float32, bitcast=True)
        part = tl.sum(tl.reshape(out, (w.shape[0] // 4, 4, w.shape[1])), 0)
    elif FAST:
        out = _dot_out(w, hl, hh, s, h_shift, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1, xa2, xb2, xc2, xd2, xa3, xb3, xc3, xd3,
                       FMT, BLOCK_M, ASM, CONSTR)
        # lane m of each run's four outputs is row m's partial: [C // 4, 4, BLOCK_N] -> [4, BLOCK_N]
        part = tl.sum(tl.reshape(out, (w.shape[0] // 4, 4, w.shape[1])), 0)
    else:
        s_lo, s_hi = _plain_scales(s, jj, FMT)
        r = _plain_row(w, hl, hh, jj, s_lo, s_hi, xa0, xb0, xc0, xd0, p00, p01, p02, p03, FMT)
        part = tl.where(cols4 == 0, r[None, :], 0.0)
        if BLOCK_M > 1:
            r = _plain_row(w, hl, hh, jj, s_lo, s_hi, xa1, xb1, xc1, xd1, p10, p11, p12, p13, FMT)
            part += tl.where(cols4 == 1, r[None, :], 0.0)
        if BLOCK_M > 2:
            r = _plain_row(w, hl, hh, jj, s_lo, s_hi, xa2, xb2, xc2, xd2, p20, p21, p22, p23, FMT)
            part += tl.where(cols4 == 2, r[None, :], 0.0)
            r = _plain_row(w, hl, hh, jj, s_lo, s_hi, xa3, xb3, xc3, xd3, p30, p31, p32, p33, FMT)
            part += tl.where(cols4 == 3, r[None, :], 0.0)
    # partials of this slice: WS[row, slice, m] (m contiguous: stored straight from the
    # reduction's layout), x's scaling undone
    rr = r0 + rn
    dst = WS + (rr[None, :].to(tl.int64) * N_SLICES + pid_s) * 4 + cols4
    keep = (rr[None, :] < row_hi) & (cols4 < BLOCK_M)
    if FAST:
        # stored from the reduction's own layout (a tl.store would first move the values to a
        # coalesced layout through shared memory, two barriers a trip)
        tl.inline_asm_elementwise(
            "{\n.reg .pred p;\nsetp.ne.b32 p, $3, 0;\n@p st.global.f32 [$1], $2;\nmov.b32 $0, 0;\n}",
            "=r,l,r,r", [dst.to(tl.int64, bitcast=True), part * inv, keep.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store(dst, part * inv, mask=keep)


@triton.jit
def slice_columns(pid_s, FMT: tl.constexpr, KBS: tl.constexpr):
    """Per word of K slice pid_s (KBS blocks of 128, a row's words contiguous in it): its column in
    the row; its scale column (q4-q6: the int32 fp16 pair of its K block; q8: its group of 32;
    NVFP4: the run's two E4M3 bytes as one int16); for q5/q6 the word holding its run's high bits
    and the shift to the run; whether it leads its run of four and its place in the run ([C, 1]);
    the x index of its byte 0 (low group; high group + HI_OFFSET; NVFP4: word t of a K block is
    half t % 2 of its 16-element block t // 2). pair_gemv.py shares it."""
    WPB: tl.constexpr = 32 if FMT == 8 else 16  # words per K block of 128
    C: tl.constexpr = KBS * WPB
    c = tl.arange(0, C)
    t = c % WPB
    kb_abs = pid_s * KBS + c // WPB
    w_cols = pid_s * C + c
    if FMT == 8:
        g_cols = kb_abs * 4 + t // 8
    elif FMT == 16:
        g_cols = kb_abs * 4 + t // 4
    else:
        g_cols = kb_abs
    v = t // 4
    if FMT == 5:
        h_cols = kb_abs * 4 + v // 2
        h_shift = (v % 2) * 16
    else:
        h_cols = kb_abs * 8 + v
        h_shift = v * 0
    if FMT == 16:
        base = kb_abs * 128 + (t // 2) * 16 + (t % 2) * 4
    else:
        base = kb_abs * 128 + t * 4
    return w_cols, g_cols, h_cols, h_shift, (c % 4) == 0, (c % 4)[:, None], base


@triton.jit
def _add_norm_rows(Y, RES, NW, HOUT, M, N, stride_ym, stride_res, stride_hout, eps, BLOCK_M: tl.constexpr):
    """For each of the M rows of y [M, N] (stored by every chunk: read past the L1): residual +=
    y rounded to the residual's dtype, out = (1 + w) RMSNorm(residual), as cuda_fast's
    add_rms_norm. In 1,024-column pieces (a whole hidden row would pin registers the GEMV's main
    loop needs): one pass adds, stores and sums squares, a second normalises."""
    CB: tl.constexpr = 1024
    c = tl.arange(0, CB)
    for mm in tl.static_range(BLOCK_M):
        if mm < M:
            sq = tl.zeros([CB], tl.float32)
            for c0 in range(0, N, CB):
                ok = c0 + c < N
                y = tl.load(Y + mm * stride_ym + c0 + c, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
                rp = RES + mm * stride_res + c0 + c
                sres = (y + tl.load(rp, mask=ok, other=0.0).to(tl.float32)).to(RES.dtype.element_ty)
                tl.store(rp, sres, mask=ok)
                sf = sres.to(tl.float32)
                sq += sf * sf
            r = tl.rsqrt(tl.sum(sq, 0) / N + eps)
            for c0 in range(0, N, CB):
                ok = c0 + c < N
                sf = tl.load(RES + mm * stride_res + c0 + c, mask=ok, other=0.0).to(tl.float32)
                w = tl.load(NW + c0 + c, mask=ok, other=0.0).to(tl.float32) + 1.0
                tl.store(HOUT + mm * stride_hout + c0 + c, (sf * r * w).to(HOUT.dtype.element_ty), mask=ok)


@triton.jit
def _l2_ahead_rows(W, H, S, row_lo, row_hi, trips, pid_s, stride_wn, stride_hn, stride_sn, FMT: tl.constexpr,
                   KBS: tl.constexpr, BLOCK_N: tl.constexpr, L2PF: tl.constexpr, ASM: tl.constexpr):
    """Row trips 2..L2PF+1 of this CTA's K slice asked of the L2 (ninfer.kernels.triton.prefetch):
    a row's slice is KBS x WPB words (one prefetch a 128-byte line), its scales and q5/q6 bit
    words a line or two; rows past the chunk are clamped to its last."""
    WPB: tl.constexpr = 32 if FMT == 8 else 16
    C: tl.constexpr = KBS * WPB
    LW: tl.constexpr = PF.pow2_lines(C * 4)
    GW: tl.constexpr = 4 * KBS if (FMT == 8 or FMT == 16) else KBS
    rn = tl.arange(0, BLOCK_N)
    wl = W + (pid_s * C + tl.arange(0, LW)[:, None] * 32)
    sl = S + pid_s * GW
    if FMT == 5 or FMT == 6:
        HW: tl.constexpr = 4 * KBS if FMT == 5 else 8 * KBS
        LH: tl.constexpr = PF.pow2_lines(HW * 4)
        hl = H + (pid_s * HW + tl.arange(0, LH)[:, None] * 32)
    for t in range(1, tl.minimum(trips, L2PF + 1)):
        r = tl.minimum(row_lo + t * BLOCK_N + rn, row_hi - 1).to(tl.int64)[None, :]
        PF.l2_prefetch(wl + r * stride_wn, ASM)
        PF.l2_prefetch(sl + r * stride_sn, ASM)
        if FMT == 5 or FMT == 6:
            PF.l2_prefetch(hl + r * stride_hn, ASM)


def l2_ahead_trips(p: QK.Prepared, cfg: "H2Config", budget: int | None = None) -> int:
    """Row trips a CTA asks the L2 for before waiting on the kernel before (prefetch.l2_trips):
    the budget (default NINFER_L2PF's) over the grid, a trip's bytes counted with the bit words and scales."""
    budget = PF.budget_bytes() if budget is None else budget
    if budget <= 0:
        return 0
    chunks, n_slices, rows_per_cta = grid_of(p, cfg)
    trip_bytes = p.walked_bytes() * cfg.block_n // max(1, p.qweight.shape[0] * n_slices)
    ctas = PF.resident(chunks * n_slices, p.sm_count, cfg.num_warps)
    return PF.l2_trips(budget, ctas, trip_bytes, -(-rows_per_cta // cfg.block_n))


@triton.jit(do_not_specialize=["M", "N", "ROWS_PER_CTA", "N_SLICES", "N_CHUNKS"])
def _gemv_h2_kernel(
    X, W, H, S, Y, WS, CNT, G, RES, NW, HOUT, ZERO,
    M, N, K,
    stride_xm, stride_wn, stride_hn, stride_sn, stride_ym, stride_res, stride_hout,
    ROWS_PER_CTA, N_SLICES, N_CHUNKS, eps, GOFF,
    FMT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KBS: tl.constexpr,
    SLICES_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD: tl.constexpr,
    ASM: tl.constexpr,
    CONSTR: tl.constexpr,
    FAST: tl.constexpr,
    PREFETCH: tl.constexpr,
    EARLY: tl.constexpr = False,
    ADD_NORM: tl.constexpr = False,
    GATED: tl.constexpr = False,
    PDL: tl.constexpr = False,
    ABLATE: tl.constexpr = 0,
    L2PF: tl.constexpr = 0,
    PIN: tl.constexpr = False,
):
    pid_c = tl.program_id(0)
    pid_s = tl.program_id(1)
    w_cols, g_cols, h_cols, h_shift, lead, jj, base = slice_columns(pid_s, FMT, KBS)
    rn = tl.arange(0, BLOCK_N)
    row_lo = pid_c * ROWS_PER_CTA
    row_hi = tl.minimum(row_lo + ROWS_PER_CTA, N)
    trips = tl.cdiv(row_hi - row_lo, BLOCK_N)
    last = row_lo + (trips - 1) * BLOCK_N  # start of the last trip: a prefetch past it re-reads it
    r0r = (row_lo + rn).to(tl.int64)[None, :]
    wp = W + r0r * stride_wn + w_cols[:, None]
    sp = S + r0r * stride_sn + g_cols[:, None]
    hp = H + r0r * stride_hn + h_cols[:, None]
    # EARLY (and always under programmatic dependent launch, where it overlaps the previous
    # kernel's tail): the first tile's weights, which do not depend on the previous kernel, are
    # requested before x is read and prepared; otherwise after (loaded first, the tile stays live
    # through x's preparation: +15-35 registers, slower on the big matrices, measured)
    if PREFETCH != 0 and (PDL or EARLY):
        w_n, hl_n, hh_n, s_n = _load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
    if L2PF > 0:
        _l2_ahead_rows(W, H, S, row_lo, row_hi, trips, pid_s, stride_wn, stride_hn, stride_sn, FMT, KBS, BLOCK_N, L2PF, FAST)
    pdl_prologue(PDL)
    xa0, xb0, xc0, xd0, p00, p01, p02, p03, inv0 = _xrow_prep(X, 0, stride_xm, M, base, FMT, HEAD, FAST, GOFF, GATED)
    if BLOCK_M > 1:
        xa1, xb1, xc1, xd1, p10, p11, p12, p13, inv1 = _xrow_prep(X, 1, stride_xm, M, base, FMT, HEAD, FAST, GOFF, GATED)
    if BLOCK_M > 2:
        xa2, xb2, xc2, xd2, p20, p21, p22, p23, inv2 = _xrow_prep(X, 2, stride_xm, M, base, FMT, HEAD, FAST, GOFF, GATED)
        xa3, xb3, xc3, xd3, p30, p31, p32, p33, inv3 = _xrow_prep(X, 3, stride_xm, M, base, FMT, HEAD, FAST, GOFF, GATED)
    if BLOCK_M == 1:
        xa1, xb1, xc1, xd1, p10, p11, p12, p13, inv1 = xa0, xb0, xc0, xd0, p00, p01, p02, p03, inv0
    if BLOCK_M < 4:
        xa2, xb2, xc2, xd2, p20, p21, p22, p23, inv2 = xa1, xb1, xc1, xd1, p10, p11, p12, p13, inv1
        xa3, xb3, xc3, xd3, p30, p31, p32, p33, inv3 = xa1, xb1, xc1, xd1, p10, p11, p12, p13, inv1
    if PREFETCH != 0 and not (PDL or EARLY):
        w_n, hl_n, hh_n, s_n = _load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
    cols4 = tl.arange(0, 4)[:, None]
    inv = tl.where(cols4 == 0, inv0, 0.0)
    if BLOCK_M > 1:
        inv += tl.where(cols4 == 1, inv1, 0.0)
    if BLOCK_M > 2:
        inv += tl.where(cols4 == 2, inv2, 0.0) + tl.where(cols4 == 3, inv3, 0.0)
    if PREFETCH == 2:
        # two tiles a trip, ping-pong: the next tile loads into the registers the last one freed
        # (no copies); an odd trip count computes and stores the last tile twice (same values)
        for r0 in range(row_lo, row_hi, 2 * BLOCK_N):
            r1 = tl.minimum(r0 + BLOCK_N, last)
            d1 = (r1 - r0).to(tl.int64)
            w_b, hl_b, hh_b, s_b = _load_tile(wp + d1 * stride_wn, sp + d1 * stride_sn, hp + d1 * stride_hn,
                                              h_shift, lead, FMT, FAST)
            w_n = _pinned(w_n, ZERO, PIN and FAST)
            _trip(w_n, hl_n, hh_n, s_n, r0, rn, row_hi, h_shift, jj, cols4, inv, WS, N_SLICES, pid_s,
                  xa0, xb0, xc0, xd0, p00, p01, p02, p03, xa1, xb1, xc1, xd1, p10, p11, p12, p13, xa2, xb2, xc2, xd2, p20, p21, p22, p23, xa3, xb3, xc3, xd3, p30, p31, p32, p33,
                  FMT, BLOCK_M, ASM, CONSTR, FAST, ABLATE)
            d2 = (tl.minimum(r0 + 2 * BLOCK_N, last) - r0).to(tl.int64)
            wp += d2 * stride_wn
            sp += d2 * stride_sn
            hp += d2 * stride_hn
            w_n, hl_n, hh_n, s_n = _load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
            w_b = _pinned(w_b, ZERO, PIN and FAST)
            _trip(w_b, hl_b, hh_b, s_b, r1, rn, row_hi, h_shift, jj, cols4, inv, WS, N_SLICES, pid_s,
                  xa0, xb0, xc0, xd0, p00, p01, p02, p03, xa1, xb1, xc1, xd1, p10, p11, p12, p13, xa2, xb2, xc2, xd2, p20, p21, p22, p23, xa3, xb3, xc3, xd3, p30, p31, p32, p33,
                  FMT, BLOCK_M, ASM, CONSTR, FAST, ABLATE)
    else:
        for r0 in range(row_lo, row_hi, BLOCK_N):
            if PREFETCH == 1:
                w = w_n
                hl = hl_n
                hh = hh_n
                s = s_n
                # the next trip's tile, or this one again after the last trip (stays in bounds)
                step = tl.where(r0 + BLOCK_N <= last, BLOCK_N, 0).to(tl.int64)
                wp += step * stride_wn
                sp += step * stride_sn
                hp += step * stride_hn
                w_n, hl_n, hh_n, s_n = _load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
                w = _pinned(w, ZERO, PIN and FAST)
            else:
                w, hl, hh, s = _load_tile(wp, sp, hp, h_shift, lead, FMT, FAST)
                wp += BLOCK_N * stride_wn
                sp += BLOCK_N * stride_sn
                hp += BLOCK_N * stride_hn
            _trip(w, hl, hh, s, r0, rn, row_hi, h_shift, jj, cols4, inv, WS, N_SLICES, pid_s,
                  xa0, xb0, xc0, xd0, p00, p01, p02, p03, xa1, xb1, xc1, xd1, p10, p11, p12, p13, xa2, xb2, xc2, xd2, p20, p21, p22, p23, xa3, xb3, xc3, xd3, p30, p31, p32, p33,
                  FMT, BLOCK_M, ASM, CONSTR, FAST, ABLATE)
    # the last slice of this row chunk to arrive sums all slices, in slice order
    tl.debug_barrier()
    arrived = SY.arrive(CNT + pid_c)
    if arrived == N_SLICES - 1:
        SY.acquire_all(arrived)
        sl = tl.arange(0, SLICES_P2)[:, None]
        for r0 in range(row_lo, row_hi, BLOCK_N):
            rr = r0 + rn
            ok = rr < row_hi
            for mm in tl.static_range(BLOCK_M):
                p = tl.load(WS + (rr[None, :].to(tl.int64) * N_SLICES + sl) * 4 + mm, mask=(sl < N_SLICES) & ok[None, :],
                            other=0.0, cache_modifier=".cg")
                y = tl.sum(p, 0)
                if FMT == 16:
                    y = y * tl.load(G + rr, mask=ok, other=0.0)  # NVFP4's per-row global scale
                tl.store(Y + mm * stride_ym + rr, y.to(Y.dtype.element_ty), mask=ok & ((rr * 0 + mm) < M))
        SY.rearm(CNT + pid_c)
        if ADD_NORM:
            # the last row chunk to finish also does the block's residual add and norm over y
            tl.debug_barrier()
            done = SY.arrive(CNT + N_CHUNKS)
            if done == N_CHUNKS - 1:
                SY.acquire_all(done)
                _add_norm_rows(Y, RES, NW, HOUT, M, N, stride_ym, stride_res, stride_hout, eps, BLOCK_M)
                SY.rearm(CNT + N_CHUNKS)


@dataclass(frozen=True)
class H2Config:
    block_n: int = 32
    kbs: int = 4  # K blocks of 128 per slice
    ctas: int = 4  # target CTAs per SM (sets the row chunk)
    num_warps: int = 4
    prefetch: int = 1  # 0: load then compute; 1: the next tile loads during this one's math; 2: the same, two tiles a trip (ping-pong, no register copies)
    early: bool = False  # the first tile requested before x is prepared (small matrices)
    pin: bool = False  # the next tile's loads kept ahead of this tile's math (_pin_loads)

    def describe(self) -> str:
        return (f"H2 BN{self.block_n} KBS{self.kbs} C{self.ctas} w{self.num_warps}" + ("", " pf", " pp")[int(self.prefetch)]
                + (" early" if self.early else "") + (" pin" if self.pin else ""))

    # the interface kernels.py dispatches through (shared with gemv.GemvConfig)
    def workspace(self, p: QK.Prepared) -> tuple[int, int]:
        return workspace_need(p, self)

    def run(self, x2: torch.Tensor, p: QK.Prepared, fast: bool | None = None) -> torch.Tensor:
        return launch(x2, p, self, fast)


_ASM: dict[tuple[int, int], tuple[str, str]] = {}


def _asm(fmt: int, block_m: int) -> tuple[str, str]:
    key = (fmt, block_m)
    if key not in _ASM:
        text, n_inputs = dot_asm(fmt, block_m)
        _ASM[key] = (text, ",".join(["=r"] * 4 + ["r"] * (4 * n_inputs)))
    return _ASM[key]


def scales_view(fmt: int, scales: torch.Tensor) -> torch.Tensor:
    """The scales as the kernel reads them: q8 fp16 per group; q4-q6 int32 (a K block's fp16
    pair); NVFP4 int16 (a run's two E4M3 bytes)."""
    if fmt == 8:
        return scales
    return scales.view(torch.int16) if fmt == NVFP4 else scales.view(torch.int32)


def enabled() -> bool:
    """NINFER_H2=0 takes this kernel out of the dispatch (A/B measurements); on by default."""
    return os.environ.get("NINFER_H2", "1") != "0"


def supports(p: QK.Prepared, cfg: H2Config) -> bool:
    return _fits(p.fmt, p.k, cfg)


def _fits(fmt: int, k: int, cfg: H2Config) -> bool:
    # a tile of fewer than 4 words a thread would be laid out 2 a thread, and the asm's pack of 4
    # would be padded with undefined registers (Triton pads silently): wrong results on the GPU
    words = cfg.kbs * WORDS[fmt] * cfg.block_n if fmt in WORDS else 0
    return (fmt in DECODES and k % (128 * cfg.kbs) == 0 and QK.ROW_PAD % cfg.block_n == 0
            and words >= 4 * 32 * cfg.num_warps)


def default_config(fmt: int, n: int, k: int) -> H2Config | None:
    """The M = 1 config where no measured winner exists (None: K not a multiple of 256). NVFP4
    first tries the config that won on 4 of its 5 tuned shapes (16 rows, 8 K blocks a slice)."""
    firsts = (H2Config(16, 8, 6, 4, 1, True),) if fmt == NVFP4 else ()
    for cfg in (*firsts, H2Config(32, 4, 4), H2Config(32, 2, 4)):
        if _fits(fmt, k, cfg):
            return cfg
    return None


def grid_of(p: QK.Prepared, cfg: H2Config) -> tuple[int, int, int]:
    """(row chunks, K slices, rows per chunk) of a launch."""
    n_slices = p.k // (128 * cfg.kbs)
    chunks, rows = QK.row_chunks(p, cfg.block_n, n_slices, cfg.ctas)
    return chunks, n_slices, rows


def workspace_need(p: QK.Prepared, cfg: H2Config) -> tuple[int, int]:
    chunks, n_slices, _ = grid_of(p, cfg)
    # one counter a row chunk, and one for the chunks' count when the launch adds and normalises
    return n_slices * MAX_M * p.n, chunks + 1


# the widest row the fused residual add + norm takes (a model's hidden size, not a head's vocabulary)
ADD_NORM_MAX_N = 16384


def add_norm_args(add_norm: tuple | None, m: int, n: int, stand_in: torch.Tensor, what: str) -> tuple:
    """A launch's fused residual add + norm, (residual [m, n], weight [n], eps, out [m, n]),
    checked; or stand_in in each tensor's place where there is none (the kernel never reads
    them then). Shared by this GEMV, the MoE pair down kernel and route_gemv."""
    if add_norm is None:
        return stand_in, stand_in, 0.0, stand_in
    res, nw, eps, hout = add_norm
    if res.shape != (m, n) or hout.shape != (m, n) or nw.shape != (n,):
        raise ValueError(f"{what} add_norm: residual {tuple(res.shape)}, out {tuple(hout.shape)} and weight "
                         f"{tuple(nw.shape)} must be [{m}, {n}], [{m}, {n}], [{n}]")
    if res.stride(1) != 1 or hout.stride(1) != 1 or nw.stride(0) != 1:
        raise ValueError(f"{what} add_norm: unit last strides needed")
    return res, nw, float(eps), hout


def launch(x2: torch.Tensor, p: QK.Prepared, cfg: H2Config, fast: bool | None = None,
           add_norm: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor] | None = None,
           gated: bool = False, ablate: int = 0, l2_budget: int | None = None) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T for M <= 4 rows (`ablate` = 1: a measurement only, see _trip;
    `l2_budget`: bytes the grid asks the L2 for ahead, default NINFER_L2PF's: prefetch.py).

    add_norm = (residual [M, n], norm weight [n], eps, out [M, n]): also, in the same launch (the
    last row chunk to finish), residual += y (rounded to its dtype) and out = (1 + w) RMSNorm of
    the new residual: a pre-norm block's `x = x + linear(h); h = norm(x)`.
    gated: x2 is [M, 2k], a merged gate | up output, and the GEMV's input is silu(gate) * up
    (rounded once to x2's dtype, as silu_mul stores it), computed as each CTA prepares its slice
    of x: a SwiGLU's down projection without the silu_mul launch before it."""
    m = x2.shape[0]
    if gated and (x2.shape[1] != 2 * p.k or x2.stride(1) != 1):
        raise ValueError(f"the f16x2 GEMV's gated input is [M, 2 x {p.k}] with a unit last stride, got "
                         f"{tuple(x2.shape)} strides {tuple(x2.stride())}")
    if add_norm is not None and p.n > ADD_NORM_MAX_N:
        raise ValueError(f"the f16x2 GEMV's add_norm takes at most {ADD_NORM_MAX_N} columns, y has {p.n}")
    res, nw, eps, hout = add_norm_args(add_norm, m, p.n, x2, "the f16x2 GEMV's")
    if m > MAX_M:
        raise ValueError(f"the f16x2 GEMV takes at most {MAX_M} rows, got {m}")
    if not supports(p, cfg):
        raise ValueError(f"the f16x2 GEMV needs q4/q5/q6/q8 or NVFP4, K % {128 * cfg.kbs} == 0 and at least four words a "
                         f"thread a trip (format {p.fmt}, K={p.k}, {cfg.describe()})")
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    block_m = QK.block_rows(m)
    chunks, n_slices, rows_per_cta = grid_of(p, cfg)
    ws = QK.Workspace.get(x2.device)
    ws.ensure(*workspace_need(p, cfg), QK.capturing(x2))
    w = p.qweight.view(torch.int32)
    h = p.qhigh.view(torch.int32) if p.qhigh is not None else w
    s = scales_view(p.fmt, p.scales)
    g = p.gscale if p.gscale is not None else s
    fast = (p.fast if fast is None else fast) and not QK.interpreting()
    asm, constr = _asm(p.fmt, block_m)
    slices_p2 = 1 << max(0, (n_slices - 1).bit_length())
    _gemv_h2_kernel[(chunks, n_slices)](
        x2, w, h, s, y, ws.partials, ws.counters, g, res, nw, hout, zero_word(x2.device) if cfg.pin else ws.counters,
        m, p.n, p.k,
        x2.stride(0), w.stride(0), h.stride(0), s.stride(0), y.stride(0), res.stride(0), hout.stride(0),
        rows_per_cta, n_slices, chunks, eps, p.k if gated else 0,
        FMT=p.fmt,
        BLOCK_N=cfg.block_n,
        KBS=cfg.kbs,
        SLICES_P2=slices_p2,
        BLOCK_M=block_m,
        HEAD=HEAD[p.fmt],
        ASM=asm,
        CONSTR=constr,
        FAST=fast,
        PREFETCH=int(cfg.prefetch),
        EARLY=bool(cfg.early),
        ADD_NORM=add_norm is not None,
        GATED=gated,
        ABLATE=ablate,
        L2PF=l2_ahead_trips(p, cfg, l2_budget),
        PIN=bool(cfg.pin),
        num_warps=cfg.num_warps,
        **pdl_kwargs(x2.device),
    )
    return y
