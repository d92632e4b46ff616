"""The CUDA C++ one-token GEMV (quant_int/gemv_cu.py, gemv_cu.cu).

CPU (CI): the kernel's decode emulated bit for bit (numpy) on random packed q4/q5/q6/q8/NVFP4 weights, every
pair of every word of every vector against the codes `formats.unpack_codes` reads back; the q5
bit permutation is one-to-one; where the kernel cannot run, why.
GPU (`-m gpu`): every built config against dequantize-then-matmul in fp32 at the 27B's shapes and
at row and K tails, gated input, bit-equal repeats, a CUDA-graph replay equal to the eager call.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ninfer_plugins.quant_int import formats as F
from ninfer_plugins.quant_int import gemv_cu as CU
from ninfer_plugins.quant_int import kernels as QK

CUDA = torch.cuda.is_available()
FACTORS = {4: (1, 16, 1, 16), 5: (1, 16, 2, 32), 6: (1, 16, 1, 16), 8: (1, 0, 1, 0)}


def _high_bits(bits: int, qhigh: torch.Tensor | None) -> np.ndarray | None:
    """A q5/q6 qhigh [rows, ...] as the kernel loads it a vector: q5 uint32 [rows, V], lo16 | hi16
    << 16 (16-bit runs t and 4 + t of each K block's 8); q6 uint32 [rows, V, 2], the words HL, HH
    (words t and 4 + t of each K block's 8: the low group's four, then the high group's)."""
    if qhigh is None:
        return None
    rows = qhigh.shape[0]
    if bits == 6:
        hw = qhigh.numpy().view(np.uint32).reshape(rows, -1, 8)
        return np.stack([hw[:, :, :4], hw[:, :, 4:]], -1).reshape(rows, -1, 2)
    runs = qhigh.numpy().view(np.uint16).reshape(rows, -1, 8).astype(np.uint32)  # [rows, K blocks, 8]
    return (runs[:, :, :4] | (runs[:, :, 4:] << 16)).reshape(rows, -1)


def _vectors(packed) -> tuple[np.ndarray, np.ndarray | None]:
    """A packed weight's codes as the kernel loads them: words uint32 [n, V, 4] and (q5/q6) the
    high bits (_high_bits)."""
    q = packed.tensors["qweight"].numpy().view(np.uint8)
    words = q.view(np.uint32).reshape(q.shape[0], -1, 4)
    return words, _high_bits(F.FORMATS[packed.scheme].bits, packed.tensors.get("qhigh"))


@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64", "q6_g64", "q8_g32"])
def test_the_decode_emulated_gives_every_code(scheme):
    bits = F.FORMATS[scheme].bits
    g = torch.Generator().manual_seed(bits)
    n, k = 5, 384
    fmt = F.FORMATS[scheme]
    # codes drawn over the format's whole range (the encoder never writes qmin; a checkpoint may)
    drawn = torch.randint(fmt.qmin, fmt.qmax + 1, (n, k), generator=g, dtype=torch.int8)
    packed = F.pack(drawn, torch.ones(n, k // fmt.group, dtype=torch.float16), fmt, k)
    codes = F.unpack_codes(packed).numpy().astype(np.float32)  # [n, Kp]
    assert np.array_equal(codes, drawn.numpy()) and codes.min() == fmt.qmin and codes.max() == fmt.qmax
    words, hb = _vectors(packed)
    fa, fb, fc, fd = FACTORS[bits]
    for r in range(n):
        got = CU.decode_words(bits, words[r], None if hb is None else hb[r]).astype(np.float32)  # [V, 4, 4, 2]
        for v in range(words.shape[1]):
            kb, t = divmod(v, 4)
            for i in range(4):
                lo = kb * 128 + 16 * t + 4 * i
                hi = lo + 64
                if bits == 8:
                    lo = 16 * v + 4 * i  # natural order, no high group: B and D decode to zeros
                    hi = lo
                want = np.array([[codes[r, lo] * fa, codes[r, lo + 2] * fa], [codes[r, hi] * fb, codes[r, hi + 2] * fb],
                                 [codes[r, lo + 1] * fc, codes[r, lo + 3] * fc],
                                 [codes[r, hi + 1] * fd, codes[r, hi + 3] * fd]])
                assert np.array_equal(got[v, i], want), (scheme, r, v, i, got[v, i], want)


def test_the_nvfp4_decode_emulated_gives_every_code():
    """Every byte value (so every code as A and as B) in every word position: each pair is the
    E2M1 values of its two elements (quant_nvfp4.kernels.unpack_byte) times 2^-14, and the block
    scales' decode is every E4M3 byte's value times 2^-8."""
    from ninfer_plugins.quant_nvfp4 import formats as NF
    from ninfer_plugins.quant_nvfp4.kernels import unpack_byte

    g = torch.Generator().manual_seed(16)
    # rows j < 4: every byte value at every position of its word (value b at position (b + j) % 4)
    every = torch.stack([torch.roll(torch.arange(256, dtype=torch.uint8), j) for j in range(4)]).view(16, 64)
    rows = torch.cat([every, torch.randint(0, 256, (4, 64), generator=g, dtype=torch.uint8)])  # [20 rows, 64 bytes]
    words = rows.numpy().view(np.uint32).reshape(20, 4, 4)  # 4 vectors a row
    got = CU.decode_words(16, words).astype(np.float32)  # [20, V, 4 words, 4 pairs, 2]
    a, b = unpack_byte(rows)
    vals = NF.e2m1_values("cpu").numpy()
    va, vb = vals[a.long().numpy()] * 2.0**-14, vals[b.long().numpy()] * 2.0**-14
    for r in range(20):
        for v in range(4):
            for i in range(4):
                j = 16 * v + 4 * i  # the word's first byte
                want = np.array([[va[r, j], va[r, j + 2]], [vb[r, j], vb[r, j + 2]], [va[r, j + 1], va[r, j + 3]],
                                 [vb[r, j + 1], vb[r, j + 3]]], dtype=np.float32)
                assert np.array_equal(got[r, v, i], want), (r, v, i, got[r, v, i], want)
    pairs = torch.arange(256, dtype=torch.int32)
    sb = (pairs | ((255 - pairs) << 8)).numpy().astype(np.uint32)
    dec = CU.fp4_scales(sb)
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy() * 2.0**-8
    finite = np.isfinite(e4m3) & np.isfinite(e4m3[::-1])
    assert np.array_equal(dec[finite, 0], e4m3[finite]) and np.array_equal(dec[finite, 1], e4m3[::-1][finite])


def test_the_tensor_core_forms_nvfp4_prescale_is_exact_in_fp16():
    """gemv_mma multiplies each decoded NVFP4 pair (E2M1 value times 2^-14) by its block scale (the
    E4M3 value) in fp16 before the MMA: every code against every finite scale, sign included, gives
    the exact product (no rounding, no underflow), so the form loses nothing to the order."""
    codes = np.arange(16, dtype=np.uint32)
    # a word whose byte 0 holds code c as its element A (sign bit 7, magnitude bits 1-3)
    words = ((codes & 7) << 1 | (codes >> 3) << 7).reshape(16, 1)
    v = CU.decode_words(16, np.concatenate([words, np.zeros((16, 3), np.uint32)], 1))[:, 0, 0, 0]  # [16] fp16
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    e4m3 = e4m3[np.isfinite(e4m3)]
    s = e4m3.astype(np.float16)
    assert np.array_equal(s.astype(np.float64), e4m3)
    got = (v[:, None] * s[None, :]).astype(np.float64)  # fp16 products, rounded once as HMUL2
    want = v.astype(np.float64)[:, None] * e4m3[None, :].astype(np.float64)
    assert np.array_equal(got, want)
    assert len(set(np.abs(v.astype(np.float64)) * 2.0**14)) == 8  # every E2M1 magnitude was covered


def _emulate(p, xp: torch.Tensor, invm: torch.Tensor, m: int) -> np.ndarray:
    """gemv_cu.cu's arithmetic over a prepared weight with its index math (vectors, scale pairs,
    16-bit runs of qhigh, the x pairs' [row][part][V] vectors, INVM [row][K block]), the decoded
    pairs multiplied and added in fp16 word by word as the kernel does: y [m, n] fp32."""
    rows, V = p.qweight.shape[0], p.qweight.shape[1] // 16
    vpb = 8 if p.fmt == 8 else 4  # vectors a K block of 128
    words = p.qweight.numpy().view(np.uint32).reshape(rows, V, 4)[: p.n]
    hb = _high_bits(p.fmt, p.qhigh)
    hb = None if hb is None else hb[: p.n]
    dec = CU.decode_words(p.fmt, words, hb)  # [n, V, 4 words, 4 parts, 2]
    xv = xp.numpy().view(np.uint32).reshape(4, 4, V, 4)  # [x row, part, vector, word]
    inv = invm.numpy().reshape(4, V // vpb)
    if p.fmt == 16:
        # NVFP4: words 0, 1 block 2v (lo), words 2, 3 block 2v + 1 (hi), the 16-bit scale pair a vector
        sc = CU.fp4_scales(p.scales.numpy().view(np.uint16).reshape(rows, V)[: p.n])  # [n, V, 2]
        out = np.zeros((m, p.n), dtype=np.float32)
        for r in range(m):
            acc = [np.zeros((p.n, V, 2), dtype=np.float16) for _ in range(2)]
            for i in range(4):
                for part in range(4):
                    pair = CU._h2(xv[r, part, :, i])[None]
                    acc[i // 2] = (dec[:, :, i, part].astype(np.float32) * pair + acc[i // 2]).astype(np.float16)
            part_sum = acc[0].astype(np.float32).sum(-1) * sc[..., 0] + acc[1].astype(np.float32).sum(-1) * sc[..., 1]
            out[r] = (part_sum * inv[r, np.arange(V) // vpb]).sum(-1) * p.gscale.numpy()[: p.n] * 2.0**22
        return out
    if p.fmt == 8:  # one scale a group of 32: two vectors
        s8 = p.scales.numpy()[: p.n].astype(np.float32)[:, np.arange(V) >> 1]
        sc = np.stack([s8, np.zeros_like(s8)], -1)
    else:  # a K block's pair (groups 2kb, 2kb + 1)
        sc = p.scales.numpy()[: p.n].astype(np.float32).reshape(p.n, V // 4, 2)[:, np.arange(V) >> 2]  # [n, V, 2]
    out = np.zeros((m, p.n), dtype=np.float32)
    for r in range(m):
        lo = np.zeros((p.n, V, 2), dtype=np.float16)
        hi = np.zeros((p.n, V, 2), dtype=np.float16)
        for i in range(4):
            pairs = [CU._h2(xv[r, part, :, i])[None] for part in range(4)]  # [1, V, 2] fp16
            lo = (dec[:, :, i, 0].astype(np.float32) * pairs[0] + lo).astype(np.float16)
            hi = (dec[:, :, i, 1].astype(np.float32) * pairs[1] + hi).astype(np.float16)
            lo = (dec[:, :, i, 2].astype(np.float32) * pairs[2] + lo).astype(np.float16)
            hi = (dec[:, :, i, 3].astype(np.float32) * pairs[3] + hi).astype(np.float16)
        part_sum = (lo.astype(np.float32).sum(-1) * sc[..., 0] + hi.astype(np.float32).sum(-1) * sc[..., 1])
        out[r] = (part_sum * inv[r, np.arange(V) // vpb]).sum(-1)
    return out


def _prepared(scheme: str, w: torch.Tensor):
    """(prepared weight, its dequantized fp32 [n, k]) for an int scheme or "nvfp4"."""
    if scheme == "nvfp4":
        from ninfer_plugins.quant_nvfp4 import formats as NF
        from ninfer_plugins.quant_nvfp4.kernels import (
            dequantize_prepared,
            prepare_nvfp4,
        )

        p = prepare_nvfp4(NF.quantize(w))
        return p, dequantize_prepared(p).float()
    from ninfer_plugins.quant_int.linear import prepare_int

    packed = F.quantize(w, scheme)
    return prepare_int(packed), F.dequantize(packed).float()


@pytest.mark.skipif(CUDA, reason="the x pairs come from the interpreted Triton kernel here")
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64", "q6_g64", "q8_g32", "nvfp4"])
@pytest.mark.parametrize("m", [1, 3, 4])
def test_the_kernels_arithmetic_emulated_matches_the_reference(scheme, m, monkeypatch):
    """The whole kernel emulated (decode, index math, fp16 sums, scales, x's per-block scaling) on
    x pairs from gemv_kw.xpairs against dequantize-then-matmul, x rows of very different scale."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from ninfer_plugins.quant_int import gemv_kw as KW

    g = torch.Generator().manual_seed(m)
    n, k = 40, 640
    p, deq = _prepared(scheme, torch.randn(n, k, generator=g))
    x = (torch.randn(m, k, generator=g) * torch.tensor([1.0, 300.0, 1e-3, 5.0][:m])[:, None]).to(torch.bfloat16)
    xp, _inv, invm = KW.xpairs(x, p.fmt, k, 1 if m == 1 else 4, fast=False)
    got = _emulate(p, xp, invm, m)
    ref = (x.float() @ deq.T).numpy()
    for r in range(m):
        assert np.linalg.norm(got[r] - ref[r]) / np.linalg.norm(ref[r]) < 6e-3, r


def _emulate_mma(p, xp: torch.Tensor, invm: torch.Tensor, m: int) -> np.ndarray:
    """gemv_cu.cu's gemv_mma lane by lane: per warp tile of 16 rows and K block, lane (g, t) puts
    word j's decoded pairs of rows g and g + 8 (vector t) in its A registers and x row g's pairs
    (word column 4 (4 kb + t) + j) in its B registers, as mma.sync m16n8k16's fragment layout
    reads them (A reg 0: row g, k 2t, 2t+1; reg 1: row g+8; reg 2: row g, k 2t+8, 2t+9; reg 3: row
    g+8; B reg 0: k 2t, 2t+1 of column g; reg 1: k 2t+8, 2t+9); the MMAs in fp32, the two groups'
    sums scaled by the row's group scales and x's 1/scale: y [m, n] fp32. NVFP4: each decoded pair
    times its row's block scale in fp16 before the MMAs (words 0, 1 block 2v, words 2, 3 block
    2v + 1), one sum a K block by x's 1/scale, the 2^14 and the global scale at the end."""
    rows, V = p.qweight.shape[0], p.qweight.shape[1] // 16
    nkb = V // 4
    words = p.qweight.numpy().view(np.uint32).reshape(rows, V, 4)
    hb = _high_bits(p.fmt, p.qhigh)
    dec = CU.decode_words(p.fmt, words, hb).astype(np.float32)  # [rows, V, 4 words, 4 parts, 2]
    xv = xp.numpy().view(np.uint32).reshape(4, 4, V, 4)
    inv = invm.numpy().reshape(4, nkb)
    nv = p.fmt == 16
    if nv:
        # the block scales as the kernel's fp4_scales_h2 makes them (E4M3 values, exact in fp16)
        s16 = CU.fp4_scales(p.scales.numpy().view(np.uint16).reshape(-1, V)[:rows]).astype(np.float32) * 256.0
        word_scale = s16[:, :, [0, 0, 1, 1]]  # [rows, V, 4 words]
        dec = (dec * word_scale[..., None, None]).astype(np.float16).astype(np.float32)
        sc = np.ones((rows, nkb, 2), dtype=np.float32)
    else:
        sc = p.scales.numpy().astype(np.float32).reshape(rows, nkb, 2)
    out = np.zeros((m, p.n), dtype=np.float32)
    for r0 in range(0, p.n, 16):
        for kb in range(nkb):
            d = [np.zeros((16, 8), dtype=np.float32) for _ in range(2)]
            for j in range(4):
                for grp in range(2):
                    a, b = np.zeros((16, 16), dtype=np.float32), np.zeros((16, 8), dtype=np.float32)
                    sel0, sel1 = (0, 2) if grp == 0 else (1, 3)  # (A, C) of group 2kb; (B, D) of 2kb + 1
                    for lane in range(32):
                        g, t = divmod(lane, 4)
                        v = 4 * kb + t
                        a[g, 2 * t : 2 * t + 2] = dec[r0 + g, v, j, sel0]
                        a[g + 8, 2 * t : 2 * t + 2] = dec[r0 + g + 8, v, j, sel0]
                        a[g, 2 * t + 8 : 2 * t + 10] = dec[r0 + g, v, j, sel1]
                        a[g + 8, 2 * t + 8 : 2 * t + 10] = dec[r0 + g + 8, v, j, sel1]
                        if g < m:
                            b[2 * t : 2 * t + 2, g] = CU._h2(xv[g, sel0, v, j : j + 1])[0]
                            b[2 * t + 8 : 2 * t + 10, g] = CU._h2(xv[g, sel1, v, j : j + 1])[0]
                    d[grp] += a @ b
            for r in range(16):
                if r0 + r < p.n:
                    s_lo, s_hi = sc[r0 + r, kb]
                    out[:, r0 + r] += (d[0][r, :m] * s_lo + d[1][r, :m] * s_hi) * inv[:m, kb]
    if nv:
        out *= p.gscale.numpy().reshape(-1)[: p.n] * 2.0**14
    return out


@pytest.mark.skipif(CUDA, reason="the x pairs come from the interpreted Triton kernel here")
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64", "nvfp4"])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_the_tensor_core_forms_fragments_emulated_match_the_reference(scheme, m, monkeypatch):
    """gemv_mma's lane-to-fragment mapping, emulated, against dequantize-then-matmul (rows not a
    multiple of 16, x rows of very different scale)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from ninfer_plugins.quant_int import gemv_kw as KW

    g = torch.Generator().manual_seed(10 + m)
    n, k = 40, 640
    p, deq = _prepared(scheme, torch.randn(n, k, generator=g))
    x = (torch.randn(m, k, generator=g) * torch.tensor([1.0, 300.0, 1e-3, 5.0][:m])[:, None]).to(torch.bfloat16)
    xp, _inv, invm = KW.xpairs(x, p.fmt, k, QK.block_rows(m), fast=False)
    got = _emulate_mma(p, xp, invm, m)
    ref = (x.float() @ deq.T).numpy()
    for r in range(m):
        assert np.linalg.norm(got[r] - ref[r]) / np.linalg.norm(ref[r]) < 6e-3, r


@pytest.mark.skipif(CUDA, reason="the x pairs come from the interpreted Triton kernel here")
@pytest.mark.parametrize("case", [("q4_g64", 40, 640, 3, 2, 2, 4), ("q5_g64", 40, 640, 4, 4, 1, 8),
                                  ("q4_g64", 40, 640, 1, 1, 4, 8), ("q5_g64", 300, 1152, 2, 1, 2, 4),
                                  ("q4_g64", 300, 1152, 4, 2, 1, 4), ("q5_g64", 300, 1152, 4, 2, 8, 8),
                                  ("nvfp4", 300, 1152, 3, 2, 2, 4), ("nvfp4", 40, 640, 4, 1, 8, 8),
                                  # K split over CTAs too (seed: the CTAs' order; KC), chunks without a
                                  # K block of their own (K = 128) and row tails among them
                                  ("q5_g64", 40, 640, 4, 1, 4, 4, 0, 2), ("q4_g64", 77, 1152, 3, 2, 2, 4, 1, 2),
                                  ("nvfp4", 40, 640, 2, 1, 8, 8, 2, 4), ("q5_g64", 40, 128, 2, 1, 4, 4, 3, 2)])
def test_the_tensor_core_form_simulated_warp_by_warp(case, monkeypatch):
    """cu_mma_sim: the kernel's walk lane by lane (pointers, U blocks a trip, KS slices and their
    sum, partial trips, rows past n, stale x rows) with the PTX fragment layout: every output stored
    once, every thread waits once, no load out of bounds or of a stale x row, the reference met."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import cu_mma_sim

    cu_mma_sim.main(*case)


def test_the_tensor_core_form_takes_q4_q5_nvfp4_at_16_rows_a_warp():
    cfg = CU.CUConfig(16, 2, 4, 2, True)
    assert cfg.describe() == "cu mma U2 w4 ks2" and cfg.rows_a_cta == 32
    assert CU._built(cfg, 4, 4) and CU._built(cfg, 1, 5) and CU._built(cfg, 4, 16)
    assert not CU._built(cfg, 4, 8) and not CU._built(cfg, 4, 6)
    assert not CU._built(CU.CUConfig(16, 4, 4, 2, True), 4, 4)  # U4 KS2 not built
    assert not CU._built(CU.CUConfig(8, 1, 4, 1, True), 4, 4)  # 16 rows a warp only


def test_the_q5_bit_permutation_is_one_to_one():
    for b in range(32):
        q = CU.q5_bits(np.array([1 << b], dtype=np.uint32))[0]
        assert int(q).bit_count() == 1, b
    assert CU.q5_bits(np.array([0xFFFFFFFF], dtype=np.uint32))[0] == 0xFFFFFFFF


def test_the_prepared_q5_words_are_the_kernels_permuted_bits():
    """q5_words (torch, at load) gives per vector exactly the word the kernel makes from its two
    16-bit runs (q5_bits of _high_bits), on random bits with every byte value."""
    g = torch.Generator().manual_seed(5)
    rows, kp = 7, 640
    qhigh = torch.randint(0, 256, (rows, kp // 8), generator=g, dtype=torch.uint8)
    qhigh[0, :] = 255
    qhigh[1, :16] = torch.arange(16, dtype=torch.uint8) * 17
    got = CU.q5_words(qhigh)
    assert got.dtype == torch.int32 and got.shape == (rows, kp // 32) and got.is_contiguous()
    want = CU.q5_bits(_high_bits(5, qhigh))
    assert np.array_equal(got.numpy().view(np.uint32), want)
    with pytest.raises(ValueError, match="16 bytes a K block"):
        CU.q5_words(qhigh[:, :8])
    tall = torch.randint(0, 256, (4100, 32), generator=g, dtype=torch.uint8)  # made in row chunks of 2048
    assert np.array_equal(CU.q5_words(tall).numpy().view(np.uint32), CU.q5_bits(_high_bits(5, tall)))


def test_prepared_words_belong_to_the_tensors_they_were_made_from(monkeypatch):
    """words_of gives the words only to the weight whose qweight and qhigh made them: a weight
    derived by dataclasses.replace (a merge, a row view) has none, and a merge drops the parts'."""
    import dataclasses

    from ninfer_plugins.quant_int.linear import int_kernels

    g = torch.Generator().manual_seed(3)
    kern = int_kernels("q5_g64")[0]
    a, b = (kern.prepare(F.quantize(torch.randn(256, 256, generator=g), "q5_g64")) for _ in range(2))
    assert CU.words_of(a) is None
    CU.attach_words(a)
    w = CU.words_of(a)
    assert w is not None and torch.equal(w, CU.q5_words(a.qhigh))
    assert CU.words_of(dataclasses.replace(a, qhigh=a.qhigh[:128], qweight=a.qweight[:128], n=128)) is None
    merged, views = kern.merge_prepared([a, b])
    assert merged.q5words is None and all(v.q5words is None for v in views)
    q4 = int_kernels("q4_g64")[0].prepare(F.quantize(torch.randn(256, 256, generator=g), "q4_g64"))
    q4.q5words = (q4.qweight, q4.qhigh, w)
    assert CU.words_of(q4) is None  # only q5 reads them


def test_ready_makes_words_only_under_the_switch(monkeypatch):
    from ninfer_plugins.quant_int.linear import int_kernels

    p = int_kernels("q5_g64")[0].prepare(F.quantize(torch.randn(256, 256), "q5_g64"))
    monkeypatch.setattr(CU, "_runs_here", lambda: True)
    monkeypatch.setattr(CU, "library", lambda device: None)
    monkeypatch.setenv("NINFER_CU_GEMV", "1")
    monkeypatch.setattr(type(p), "device", property(lambda self: torch.device("cuda")))
    monkeypatch.delenv("NINFER_Q5_WORDS", raising=False)
    CU.ready(p)
    assert CU.words_of(p) is None
    monkeypatch.setenv("NINFER_Q5_WORDS", "1")
    CU.ready(p)
    assert CU.words_of(p) is not None


def _trial(monkeypatch, tmp_path, entries: dict) -> None:
    f = tmp_path / f"tuned_cu_{len(list(tmp_path.iterdir()))}.py"  # a new name: the table is read once a file
    f.write_text("TUNED_CU = " + repr(entries) + "\n")
    monkeypatch.setenv("NINFER_CU_TUNED", str(f))
    monkeypatch.delenv("NINFER_CU_GEMV", raising=False)
    monkeypatch.delenv("NINFER_Q5_WORDS", raising=False)
    monkeypatch.setenv("NINFER_CU_CARD", "0")


def test_a_winner_on_words_is_picked_first_for_q5_and_not_under_words_off(monkeypatch, tmp_path):
    """A TUNED_CU entry keyed Q5_WORDS is q5's winner on its words: pick gives it (marked words=1)
    ahead of the plain entry, and NINFER_Q5_WORDS=0 gives the plain entry (or nothing)."""
    _trial(monkeypatch, tmp_path, {(21, 256, 768, 1): (2, 2, 4, 2), (5, 256, 768, 1): (2, 1, 4, 4),
                                   (21, 256, 768, 4): (16, 1, 8, 8, True), (21, 256, 640, 1): (8, 4, 4, 1)})
    assert CU.pick(5, 1, 256, 768) == CU.CUConfig(2, 2, 4, 2, words=1)
    assert CU.pick(5, 4, 256, 768) == CU.CUConfig(16, 1, 8, 8, True, words=1)
    assert CU.pick(4, 1, 256, 768) is None  # only q5 has words
    assert CU.pick(5, 1, 256, 640) is None  # R8 U4 is not built: falls through, no plain entry
    assert CU.pick(5, 1, 256, 768).describe() == "cu R2 U2 w4 ks2 words"
    monkeypatch.setenv("NINFER_Q5_WORDS", "0")
    assert CU.pick(5, 1, 256, 768) == CU.CUConfig(2, 1, 4, 4) and CU.pick(5, 4, 256, 768) is None


def test_a_cards_entries_come_over_the_shared_table(monkeypatch):
    """tuned.TUNED_CU_CARD[card()] over TUNED_CU, for that card only; NINFER_CU_CARD=0 none; every
    entry a config the library holds for its format and row count."""
    from ninfer_plugins.quant_int.tuned import TUNED_CU, TUNED_CU_CARD

    monkeypatch.delenv("NINFER_CU_TUNED", raising=False)
    monkeypatch.delenv("NINFER_CU_GEMV", raising=False)
    monkeypatch.delenv("NINFER_Q5_WORDS", raising=False)
    assert set(TUNED_CU_CARD) <= {"H100", "H200"}
    for tag, table in TUNED_CU_CARD.items():
        for (fmt, n, k, m), entry in table.items():
            assert fmt in (*CU.FORMATS, CU.Q5_WORDS) and CU._built(CU.CUConfig(*entry), m, 5 if fmt == CU.Q5_WORDS else fmt), (tag, fmt, n, k, m)
    monkeypatch.setenv("NINFER_CU_CARD", "H100")
    h100 = TUNED_CU_CARD["H100"]
    assert CU.pick(4, 4, 34816, 5120) == CU.CUConfig(*h100[(4, 34816, 5120, 4)])
    assert CU.pick(5, 1, 5120, 17408) == CU.CUConfig(*h100[(21, 5120, 17408, 1)], words=1)
    assert CU.words_tuned(5120, 17408) and not CU.words_tuned(5120, 6144)
    assert CU.words_for_k(17408) and CU.words_for_k(5120) and not CU.words_for_k(6144)
    for tag in ("0", "H200", ""):
        monkeypatch.setenv("NINFER_CU_CARD", tag)
        assert CU.pick(4, 4, 34816, 5120) is None  # the tensor-core K-walk's, as on the H200
        assert CU.pick(5, 1, 5120, 17408) == CU.CUConfig(*TUNED_CU[(5, 5120, 17408, 1)])
        assert not CU.words_for_k(17408) and CU.card() == ("" if tag == "0" else tag)


def test_the_first_table_that_names_a_shape_decides(monkeypatch, tmp_path):
    """A trial file's plain q5 winner runs, not a card's winner on words for the same shape; a card's
    () (measured to lose there) hides the shared table's entry."""
    from ninfer_plugins.quant_int import tuned

    monkeypatch.setitem(tuned.TUNED_CU_CARD, "T", {(21, 256, 768, 1): (2, 2, 4, 2), (5, 256, 640, 1): (),
                                                    (21, 256, 512, 1): (2, 2, 4, 2)})
    monkeypatch.setitem(tuned.TUNED_CU, (5, 256, 640, 1), (2, 1, 4, 1))
    _trial(monkeypatch, tmp_path, {(5, 256, 768, 1): (4, 1, 4, 1)})
    monkeypatch.setenv("NINFER_CU_CARD", "T")
    assert CU.pick(5, 1, 256, 768) == CU.CUConfig(4, 1, 4, 1)  # the trial file's plain winner
    assert CU.pick(5, 1, 256, 512) == CU.CUConfig(2, 2, 4, 2, words=1)  # the card's, nothing above it
    assert CU.pick(5, 1, 256, 640) is None and CU.tuned_entry(5, 256, 640, 1) is None  # the card's ()
    monkeypatch.setenv("NINFER_CU_CARD", "0")
    assert CU.pick(5, 1, 256, 640) == CU.CUConfig(2, 1, 4, 1)


def test_only_the_cards_the_tables_were_measured_on_get_a_tag():
    assert CU.card_of("NVIDIA H100 80GB HBM3") == "H100" and CU.card_of("NVIDIA H200") == "H200"
    for other in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA GH200 480GB", "NVIDIA H200 NVL",
                  "NVIDIA GeForce RTX 5090", ""):
        assert CU.card_of(other) == "", other


def test_ready_makes_words_where_a_winner_on_words_names_the_weight(monkeypatch, tmp_path):
    from ninfer_plugins.quant_int.linear import int_kernels

    p = int_kernels("q5_g64")[0].prepare(F.quantize(torch.randn(256, 256), "q5_g64"))
    monkeypatch.setattr(CU, "_runs_here", lambda: True)
    monkeypatch.setattr(CU, "library", lambda device: None)
    monkeypatch.setattr(type(p), "device", property(lambda self: torch.device("cuda")))
    _trial(monkeypatch, tmp_path, {(21, p.n, p.k, 4): (16, 2, 4, 2, True)})
    monkeypatch.setenv("NINFER_Q5_WORDS", "0")
    CU.ready(p)
    assert CU.words_of(p) is None
    monkeypatch.delenv("NINFER_Q5_WORDS")
    CU.ready(p)
    assert CU.words_of(p) is not None


def test_a_winner_on_words_runs_the_plain_winner_for_a_weight_without_words(monkeypatch, tmp_path):
    """launch's choice (_with_words): a words config reads the weight's words; for a weight without
    them (a row view of a merged weight) the shape's plain winner, else the same config on qhigh;
    NINFER_Q5_WORDS=0 reads no words even where a weight has them."""
    import dataclasses

    from ninfer_plugins.quant_int.linear import int_kernels

    p = int_kernels("q5_g64")[0].prepare(F.quantize(torch.randn(256, 256), "q5_g64"))
    _trial(monkeypatch, tmp_path, {(21, p.n, p.k, 1): (2, 2, 4, 2), (5, p.n, p.k, 1): (2, 1, 4, 1)})
    words_cfg = CU.pick(5, 1, p.n, p.k)
    assert words_cfg.words == 1
    assert CU._with_words(p, words_cfg, 1) == (CU.CUConfig(2, 1, 4, 1), None)
    assert CU._with_words(p, CU.CUConfig(4, 1, 4), 1) == (CU.CUConfig(4, 1, 4), None)
    CU.attach_words(p)
    cfg, words = CU._with_words(p, words_cfg, 1)
    assert cfg == words_cfg and words is CU.words_of(p)
    assert CU._with_words(p, CU.CUConfig(4, 1, 4), 1)[1] is words  # a plain config reads words a weight has
    monkeypatch.setenv("NINFER_Q5_WORDS", "0")
    assert CU._with_words(p, words_cfg, 1) == (CU.CUConfig(2, 1, 4, 1), None)
    monkeypatch.delenv("NINFER_Q5_WORDS")
    _trial(monkeypatch, tmp_path, {(21, p.n, p.k, 1): (2, 2, 4, 2)})
    bare = dataclasses.replace(p, q5words=None)
    assert CU._with_words(bare, words_cfg, 1) == (words_cfg, None)  # no plain winner: the same config on qhigh


def test_the_memory_plan_counts_words_where_a_winner_on_words_applies(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from ninfer_plugins.quant_int.linear import int_kernels

    gpu = SimpleNamespace(kind="cuda")
    q5 = int_kernels("q5_g64")[0]
    _trial(monkeypatch, tmp_path, {(21, 16384, 5120, 4): (16, 2, 4, 2, True)})
    # every q5 weight of that K, not only the named shape: qkv + z's words are made for a merged
    # shape the plan sees only as its parts (10240 x 5120, 6144 x 5120)
    assert q5.resident_bytes(6144, 5120, 1000, gpu) == 1000 + 6144 * 5120 // 8
    assert q5.resident_bytes(5120, 6144, 1000, gpu) == 1000  # no winner on words at K = 6144
    monkeypatch.setenv("NINFER_Q5_WORDS", "1")
    assert q5.resident_bytes(5120, 6144, 1000, gpu) == 1000 + 5120 * 6144 // 8
    monkeypatch.setenv("NINFER_Q5_WORDS", "0")
    assert q5.resident_bytes(6144, 5120, 1000, gpu) == 1000


def test_the_kernels_offsets_are_the_emulated_decodes():
    """pair_offset in gemv_cu.cu (what the decode subtracts, and what the ofs configs' MMA takes out)
    holds the emulation's OFFSETS, pair by pair."""
    import re

    src = CU.SOURCE.read_text()
    body = src[src.index("float pair_offset(int pair)") :].split("}", 1)[0]
    nums = [int(float(v)) for v in re.findall(r"(\d+)\.f", body)]
    q4_odd, q4_even, *q5 = nums
    assert (q4_even, q4_odd, q4_even, q4_odd) == CU.OFFSETS[4]
    assert tuple(q5) == CU.OFFSETS[5]


def test_the_memory_plan_counts_the_words_under_the_switch(monkeypatch):
    from types import SimpleNamespace

    from ninfer_plugins.quant_int.linear import int_kernels

    gpu, cpu = SimpleNamespace(kind="cuda"), SimpleNamespace(kind="cpu")
    q5, q4 = int_kernels("q5_g64")[0], int_kernels("q4_g64")[0]
    monkeypatch.delenv("NINFER_Q5_WORDS", raising=False)
    monkeypatch.delenv("NINFER_CU_TUNED", raising=False)
    monkeypatch.setenv("NINFER_CU_CARD", "0")  # no card's winners on words
    assert q5.resident_bytes(5120, 17408, 1000, gpu) == 1000
    monkeypatch.setenv("NINFER_Q5_WORDS", "1")
    assert q5.resident_bytes(5120, 17408, 1000, gpu) == 1000 + 5120 * 17408 // 8
    assert q5.resident_bytes(8, 100, 1000, gpu) == 1000 + 8 * 128 // 8  # K padded to whole blocks
    assert q5.resident_bytes(5120, 17408, 1000, cpu) == 1000 and q4.resident_bytes(5120, 17408, 1000, gpu) == 1000


def test_the_library_builds_every_config_the_dispatch_may_name():
    """The kernel instantiations in gemv_cu.cu (pick's cases, with and without the pipelined walk,
    and pick_mma's) are exactly BUILT, BUILT_PF and BUILT_MMA."""
    import re

    src = CU.SOURCE.read_text()
    case = {tuple(int(v) for v in t) for t in re.findall(r"NINFER_CASE\((\d+), (\d+), (\d+), (\d+)\)", src)}
    pf = {tuple(int(v) for v in t) for t in re.findall(r"NINFER_PF\((\d+), (\d+), (\d+), (\d+)\)", src)}
    mma = {tuple(int(v) for v in t) for t in re.findall(r"NINFER_MMA\((\d+), (\d+)\)", src)}
    mma_pf = {tuple(int(v) for v in t) for t in re.findall(r"NINFER_MMA_PF\((\d+), (\d+)\)", src)}
    ofs = {tuple(int(v) for v in t) for t in re.findall(r"NINFER_MMA_OFS\((\d+), (\d+), (\d+)\)", src)}
    kc = {tuple(int(v) for v in t) for t in re.findall(r"NINFER_MMA_KC\((\d+), (\d+), (\d+)\)", src)}
    assert ofs == set(CU.BUILT_MMA_OFS) and kc == set(CU.BUILT_MMA_KC)
    assert case == {(m, *c) for m, cs in CU.BUILT.items() for c in cs}
    assert pf == {(m, *c) for m, cs in CU.BUILT_PF.items() for c in cs}
    assert mma == set(CU.BUILT_MMA) and mma_pf == set(CU.BUILT_MMA_PF)


def test_a_late_launch_triggers_its_dependents_after_its_wait():
    """Inside launch.late_dependents() (the GDN decode step's projection) the kernel is launched
    with pdl = 2: its dependents may read, before their own wait, what earlier kernels wrote."""
    from ninfer.kernels.triton.launch import late_dependents, pdl_value

    assert CU._pdl(False, pdl_value()) == 0 and CU._pdl(True, pdl_value()) == 1
    with late_dependents():
        assert CU._pdl(True, pdl_value()) == 2 and CU._pdl(False, pdl_value()) == 0


def test_built_configs_are_the_librarys_at_4_and_8_warps():
    for m in range(1, CU.MAX_M + 1):
        cfgs = CU.built_configs(m)
        assert len(set(cfgs)) == len(cfgs)
        assert all(CU._built(c, m, 4) for c in cfgs)
        assert {(c.rows, c.unroll, c.ksplit) for c in cfgs if not c.mma and not c.pf} == set(CU.BUILT[m])
        assert {(c.rows, c.unroll, c.ksplit) for c in cfgs if c.pf and not c.mma} == set(CU.BUILT_PF.get(m, ()))
        assert {(c.unroll, c.ksplit) for c in cfgs if c.mma and not c.pf and not c.ofs and c.kc == 1} == set(CU.BUILT_MMA)
        assert {(c.unroll, c.ksplit, c.kc) for c in cfgs if c.kc > 1} == set(CU.BUILT_MMA_KC)
        assert {(c.unroll, c.ksplit) for c in cfgs if c.mma and c.pf and not c.ofs} == set(CU.BUILT_MMA_PF)
        assert {(c.unroll, c.ksplit, c.pf) for c in cfgs if c.ofs} == set(CU.BUILT_MMA_OFS)
        assert {c.num_warps for c in cfgs} == {4, 8}


def _chunk_walk(nkb: int, u: int, ks: int, kc: int) -> list[list[int]]:
    """gemv_mma's K walk, as its loops run it: per (chunk, slice) the K blocks loaded, chunk c's
    blocks [c nkb / kc, (c + 1) nkb / kc), slice s from U s in trips of U KS, a trip's block u read
    while below the chunk's end."""
    out = []
    for chunk in range(kc):
        kend = (chunk + 1) * nkb // kc
        for sl in range(ks):
            got, kb0 = [], chunk * nkb // kc + u * sl
            while kb0 < kend:
                got += [kb0 + j for j in range(u) if j == 0 or kb0 + j < kend]
                kb0 += u * ks
            out.append(got)
    return out


@pytest.mark.parametrize("nkb", [1, 2, 3, 5, 34, 48, 136, 137])
def test_the_k_chunks_cover_every_block_once(nkb):
    for u, ks, kc in (*CU.BUILT_MMA_KC, *((u, ks, 1) for u, ks in CU.BUILT_MMA)):
        walked = [b for part in _chunk_walk(nkb, u, ks, kc) for b in part]
        assert sorted(walked) == list(range(nkb)), (nkb, u, ks, kc)


def test_a_k_chunked_config_and_its_workspace():
    """kc > 1: only the tensor-core form's BUILT_MMA_KC, not pipelined nor ofs; its workspace is kc
    chunks' sums (128 floats a row group) and a counter a row group of the grid, none at kc = 1."""
    from types import SimpleNamespace

    cfg = CU.CUConfig(16, 1, 8, 8, True, kc=2)
    assert CU._built(cfg, 4, 5) and cfg.describe() == "cu mma U1 w8 ks8 kc2"
    assert not CU._built(CU.CUConfig(16, 1, 8, 8, True, pf=1, kc=2), 4, 5)
    assert not CU._built(CU.CUConfig(16, 4, 4, 1, True, kc=2), 4, 5)  # not built
    assert not CU._built(CU.CUConfig(2, 1, 4, 2, kc=2), 1, 5)  # the CUDA-core form has none
    assert not CU._built(cfg, 4, 8)  # the tensor-core form is q4/q5/NVFP4
    p = SimpleNamespace(n=5120)
    assert cfg.groups(5120) == 320 and cfg.workspace(p) == (2 * 320 * 128, 320)
    four = CU.CUConfig(16, 2, 4, 2, True, kc=2)  # 2 row groups a CTA: 77 rows -> 3 CTAs, 6 groups
    assert four.groups(77) == 6 and four.workspace(SimpleNamespace(n=77)) == (2 * 6 * 128, 6)
    assert CU.CUConfig(16, 1, 8, 8, True).workspace(p) == (0, 0)


def test_a_weight_named_by_a_k_chunked_winner_gets_its_workspace_at_load(monkeypatch, tmp_path):
    """ready() reserves the split-K workspace of every kc > 1 entry naming the weight, in any table
    (any card's too: NINFER_CU_CARD may change between runs), so no capture has to grow it."""
    import types

    from ninfer_plugins.quant_int import tuned
    from ninfer_plugins.quant_int.linear import int_kernels

    p = int_kernels("q5_g64")[0].prepare(F.quantize(torch.randn(256, 512), "q5_g64"))
    monkeypatch.setattr(CU, "_runs_here", lambda: True)
    monkeypatch.setattr(CU, "library", lambda device: None)
    monkeypatch.setattr(type(p), "device", property(lambda self: torch.device("cuda")))
    reserved = []
    fake = types.SimpleNamespace(reserve=lambda elems, tiles: reserved.append((elems, tiles)))
    monkeypatch.setattr(QK.Workspace, "get", classmethod(lambda cls, device: fake))
    monkeypatch.setitem(tuned.TUNED_CU_CARD, "T", {(21, 256, 512, 4): (16, 1, 8, 8, True, 0, 0, 4)})
    _trial(monkeypatch, tmp_path, {(5, 256, 512, 4): (16, 2, 4, 2, True, 0, 0, 2)})
    monkeypatch.setenv("NINFER_CU_GEMV", "1")
    CU.ready(p)
    assert sorted(reserved) == [(2 * 16 * 128, 16), (4 * 16 * 128, 16)]


def test_unavailable_says_why_on_the_cpu():
    assert "CUDA GPU" in CU.unavailable(torch.device("cpu"))


# --- GPU -------------------------------------------------------------------------------------------

def _case(scheme: str, n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return _prepared(scheme, torch.randn(n, k, device="cuda", generator=g))


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme,n,k", [("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120),
                                        ("q5_g64", 5120, 6144), ("q4_g64", 1024, 5120), ("q4_g64", 300, 640),
                                        ("q5_g64", 77, 1152), ("q5_g64", 13312, 5120), ("q8_g32", 14336, 5120),
                                        ("q8_g32", 5120, 17408), ("q8_g32", 12288, 2048), ("q8_g32", 2048, 4096),
                                        ("q8_g32", 40, 384), ("nvfp4", 34816, 5120), ("nvfp4", 5120, 17408),
                                        ("nvfp4", 16384, 5120), ("nvfp4", 5120, 6144), ("nvfp4", 12288, 2048),
                                        ("nvfp4", 300, 640), ("q6_g64", 16384, 5120), ("q6_g64", 8192, 2048),
                                        ("q6_g64", 300, 640)])
def test_every_config_matches_the_reference(scheme, n, k):
    why = CU.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    p, deq = _case(scheme, n, k, n + k)
    for m in (1, 2, 3, 4):
        # rows of x a thousand-fold apart in scale: each x row has its own pairs and scaling
        x = (torch.randn(m, k, device="cuda") * torch.tensor([1.0, 300.0, 1e-3, 5.0][:m], device="cuda")[:, None])
        x = x.to(torch.bfloat16)
        ref = x.float() @ deq.T
        for cfg in CU.built_configs(m):
            if not CU.supports(p, cfg, m):
                continue
            y = CU.launch(x, p, cfg)
            assert y.shape == (m, n)
            for i in range(m):
                assert _rel(y[i], ref[i]) < 6e-3, (m, i, cfg.describe(), _rel(y[i], ref[i]))
            assert torch.equal(y, CU.launch(x, p, cfg))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme,n,k", [("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120), ("q5_g64", 77, 1152),
                                        ("q4_g64", 300, 640), ("q6_g64", 300, 640), ("q8_g32", 40, 384),
                                        ("nvfp4", 300, 640)])
def test_the_pipelined_walk_and_the_q5_words_give_the_same_bits(scheme, n, k):
    """The pipelined walk (pf = 1) does the same arithmetic in the same order as its plain config,
    and q5 with prepared words the same as with its runs of qhigh: the outputs are bit-equal, every
    form, every x row count (a partial last trip and row tails included)."""
    import dataclasses

    why = CU.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    p, deq = _case(scheme, n, k, 7 * n + k)
    pw = None
    if scheme == "q5_g64":
        pw = dataclasses.replace(p)
        CU.attach_words(pw)
        assert CU.words_of(pw) is not None and CU.words_of(p) is None
    for m in (1, 2, 3, 4):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = x.float() @ deq.T
        for cfg in CU.built_configs(m):
            if not CU.supports(p, cfg, m):
                continue
            y = CU.launch(x, p, cfg)
            if cfg.pf:
                plain = dataclasses.replace(cfg, pf=0)
                assert torch.equal(y, CU.launch(x, p, plain)), (m, cfg.describe())
            if cfg.ofs:
                # the offsets out in fp32 after the MMAs, not in f16 before: not bit-equal, but
                # within a bf16 rounding of the subtracting form
                sub = dataclasses.replace(cfg, ofs=0)
                assert _rel(y, CU.launch(x, p, sub).float()) < 3e-3, (m, cfg.describe())
            if cfg.kc > 1:
                # the chunks' sums added in chunk order: not bit-equal to one CTA's walk, within a
                # bf16 rounding of it
                one = dataclasses.replace(cfg, kc=1)
                if CU.supports(p, one, m):
                    assert _rel(y, CU.launch(x, p, one).float()) < 3e-3, (m, cfg.describe())
            if pw is not None:
                assert torch.equal(CU.launch(x, pw, cfg), y), (m, cfg.describe())
            assert _rel(y, ref) < 6e-3, (m, cfg.describe())


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_nvfp4_blocks_of_tiny_scale_through_every_form():
    """NVFP4 rows 3e-5 the size of the others (one global scale for the tensor): their E4M3 block
    scales are subnormal and the tensor-core form feeds the MMA f16 subnormal products (v * s *
    2^-14 near 2^-20); every form meets the reference on those rows as on the large ones."""
    why = CU.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    n, k = 1024, 2048
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(n, k, device="cuda", generator=g)
    w[n // 2 :] *= 3e-5  # block scales 1-7 x 2^-9: every one an E4M3 subnormal
    p, deq = _prepared("nvfp4", w)
    assert float(deq[n // 2 :].abs().max()) > 0  # the tiny rows did not quantize to zero
    for m in (1, 4):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = x.float() @ deq.T
        for cfg in CU.built_configs(m):
            if not CU.supports(p, cfg, m):
                continue
            y = CU.launch(x, p, cfg).float()
            for rows in (slice(0, n // 2), slice(n // 2, n)):
                err = _rel(y[:, rows], ref[:, rows])
                assert err < 6e-3, (m, cfg.describe(), rows, err)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64", "nvfp4"])
def test_gated_input_and_a_graph_replay(scheme):
    why = CU.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    n, k = 5120, 17408
    p, deq = _case(scheme, n, k, 7)
    gu = (torch.randn(1, 2 * k, device="cuda") * 2).to(torch.bfloat16)
    x = (torch.nn.functional.silu(gu[:, :k].float()) * gu[:, k:].float()).to(torch.bfloat16)
    ref = x.float() @ deq.T
    for cfg in (CU.CUConfig(2, 2, 4), CU.CUConfig(4, 1, 8), CU.CUConfig(16, 1, 8, 8, True, kc=2),
                CU.CUConfig(16, 2, 4, 2, True, kc=2)):
        # the K-chunked forms: their counters back at zero after each replay, or the next one's
        # last chunk would not be the one that stores y
        if cfg.kc > 1:
            QK.Workspace.get(x.device).reserve(*cfg.workspace(p))
        y = CU.launch(gu, p, cfg, gated=True)
        assert _rel(y, ref) < 6e-3
        eager = CU.launch(x, p, cfg)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = CU.launch(x, p, cfg)
        for _ in range(3):
            out.zero_()
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, eager)
        if cfg.kc > 1:
            assert int(QK.Workspace.get(x.device).counters.count_nonzero()) == 0  # every counter set back


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_rows_the_ctas_cannot_tile_fall_back_to_the_k_walk():
    """A row view whose stored rows end before n rounded up to rows x warps (a merged weight's part)."""
    import dataclasses

    why = CU.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    p, deq = _case("q5_g64", 256, 1024, 5)
    view = dataclasses.replace(p, n=36, qweight=p.qweight[:36], scales=p.scales[:36], qhigh=p.qhigh[:36])
    x = torch.randn(2, 1024, device="cuda").to(torch.bfloat16)
    cfg = CU.CUConfig(4, 1, 4)
    assert not CU.supports(view, cfg, 2)
    assert _rel(CU.launch(x, view, cfg), x.float() @ deq[:36].T) < 6e-3


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_the_dispatch_takes_it_under_its_switch(monkeypatch):
    from ninfer_plugins.quant_int import kernels as K

    why = CU.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    p, deq = _case("q5_g64", 5120, 6144, 3)
    x = torch.randn(4, 6144, device="cuda").to(torch.bfloat16)
    ref = x.float() @ deq.T
    # unset: the measured winners only (this shape has a TUNED_CU entry at M = 1, none at M = 4)
    for switch, m, kind in (("", 1, CU.CUConfig), ("", 4, None), ("1", 1, CU.CUConfig), ("1", 4, None),
                            ("4", 4, CU.CUConfig), ("0", 1, None)):
        monkeypatch.setenv("NINFER_CU_GEMV", switch)
        cfg = K.pick_gemv(5, m, 5120, 6144, p.sm_count)
        assert isinstance(cfg, CU.CUConfig) == (kind is not None), (switch, m, cfg)
        assert _rel(K.launch(x[:m], p), ref[:m]) < 6e-3


def test_pick_takes_measured_winners_by_default_and_every_shape_under_the_switch(monkeypatch):
    from ninfer_plugins.quant_int.tuned import TUNED_CU

    assert (5, 5120, 6144, 1) in TUNED_CU and (5, 5120, 6144, 4) not in TUNED_CU
    monkeypatch.delenv("NINFER_CU_TUNED", raising=False)
    for switch in ("", "1", "4"):
        monkeypatch.setenv("NINFER_CU_GEMV", switch)
        assert CU.pick(5, 1, 5120, 6144) == CU.CUConfig(*TUNED_CU[(5, 5120, 6144, 1)])
        assert CU.pick(7, 1, 5120, 6144) is None  # not a format of the kernel
        assert CU.pick(5, 1, 5120, 6100) is None  # K not whole blocks of 128
    monkeypatch.setenv("NINFER_CU_GEMV", "")
    assert CU.mode() == "tuned" and CU.pick(5, 4, 5120, 6144) is None and CU.pick(5, 1, 256, 640) is None
    monkeypatch.setenv("NINFER_CU_GEMV", "1")
    assert CU.pick(5, 1, 256, 640) == CU.DEFAULT[1]
    monkeypatch.setenv("NINFER_CU_GEMV", "4")
    assert CU.pick(5, 4, 5120, 6144) == CU.DEFAULT[4]
    # =1 keeps the tuned winners at every row count (a superset of the default)
    monkeypatch.setenv("NINFER_CU_GEMV", "1")
    assert CU.pick(16, 4, 5120, 17408) == CU.CUConfig(*TUNED_CU[(16, 5120, 17408, 4)])
    assert CU.pick(5, 4, 5120, 6144) is None
    monkeypatch.setenv("NINFER_CU_GEMV", "0")
    assert not CU.enabled(1)


def test_a_tuned_entry_the_library_does_not_hold_falls_through(monkeypatch, tmp_path):
    trial = tmp_path / "tuned_cu.py"
    trial.write_text("TUNED_CU = {(5, 256, 640, 1): (8, 4, 4, 1), (5, 256, 768, 1): (2, 1, 4, 1)}\n")
    monkeypatch.setenv("NINFER_CU_TUNED", str(trial))
    monkeypatch.delenv("NINFER_CU_GEMV", raising=False)
    assert CU.pick(5, 1, 256, 640) is None  # R8 U4 is not built
    assert CU.pick(5, 1, 256, 768) == CU.CUConfig(2, 1, 4, 1)


def test_the_library_is_prepared_only_for_weights_it_was_measured_on(monkeypatch):
    import types

    from ninfer_plugins.quant_int.tuned import TUNED_CU

    monkeypatch.delenv("NINFER_CU_TUNED", raising=False)
    fmt, n, k, _m = next(iter(TUNED_CU))
    tuned = types.SimpleNamespace(fmt=fmt, n=n, k=k)
    assert CU.tuned_for(tuned) and not CU.tuned_for(types.SimpleNamespace(fmt=fmt, n=n + 128, k=k))


def test_a_library_that_cannot_be_built_is_a_runtime_error(monkeypatch):
    """An unwritable cache or a library the loader refuses (OSError) is given up like a failed
    build, so a model still loads on the Triton kernels."""
    monkeypatch.setattr(CU, "_LIBS", {})

    def refuse(arch):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(CU, "_build_and_load", refuse)
    monkeypatch.setattr(CU, "_arch", lambda device: "90")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(RuntimeError, match="read-only cache"):
        CU.library(torch.device("cuda", 0))


@pytest.mark.skipif(CUDA, reason="the fallback where the kernel cannot run")
def test_the_switch_falls_back_where_the_kernel_cannot_run(monkeypatch):
    from ninfer_plugins.quant_int import kernels as K

    monkeypatch.setenv("NINFER_CU_GEMV", "4")
    assert not CU.enabled(1)
    assert not isinstance(K.pick_decode(4, 1, 34816, 5120, 132), CU.CUConfig)


@pytest.mark.skipif(CUDA, reason="the interpreted kernels run here")
@pytest.mark.parametrize("k", [512, 640])  # 4 K blocks: the K-walk's default; 5: none, so the tile kernel
def test_the_fallback_without_the_kernel_matches_the_reference(k, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from ninfer_plugins.quant_int.linear import prepare_int

    g = torch.Generator().manual_seed(k)
    packed = F.quantize(torch.randn(40, k, generator=g), "q5_g64")
    p = prepare_int(packed)
    gu = (torch.randn(2, 2 * k, generator=g) * 2).to(torch.bfloat16)
    x = (torch.nn.functional.silu(gu[:, :k].float()) * gu[:, k:].float()).to(torch.bfloat16)
    ref = x.float() @ F.dequantize(packed).T
    for inp, gated in ((x, False), (gu, True)):
        # launch() where the kernel cannot run (no GPU here) takes the same fallback
        for y in (CU._fallback(inp, p, gated), CU.launch(inp, p, CU.CUConfig(2, 1, 4), gated=gated)):
            assert y.shape == (2, 40)
            assert float((y.float() - ref).norm() / ref.norm()) < 6e-3, gated
