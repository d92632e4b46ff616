"""The K-walk GEMV (quant_int/gemv_kw.py) against dequantize-then-matmul in fp32.

CPU (CI): the interpreted kernel at tiny sizes, every format, M = 1..4, one and several K splits
(the split counters reset), row tails, gated input, x of huge and tiny scale, gemv_h2's results
on the same inputs; the prepared x pairs against gemv_h2's scaling rules. The fast path's PTX is
gemv_h2's (`_dot_out`), checked in test_gemv_h2's emulator tests.
GPU (`-m gpu`): the 27B/35B shapes at M = 1..4, fast path, against the reference and gemv_h2.
"""

from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch
import triton
import triton.language as tl

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

from ninfer_plugins.quant_int import gemv_h2 as H  # noqa: E402
from ninfer_plugins.quant_int import gemv_kw as KW  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from test_gemv_h2 import SCHEME_OF, count_launches, norm_inputs, packed_and_ref, rel_err, replayed  # noqa: E402  (same folder)

interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")
SCHEMES = ["q4_g64", "q5_g64", "q6_g64", "q8_g32", "nvfp4"]
DEV = "cuda" if CUDA else "cpu"


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    "m,n,k,cfg",
    [
        (1, 70, 512, KW.KWConfig(16, 32)),  # row tail, several trips
        (2, 64, 512, KW.KWConfig(32, 32, 2)),  # two splits
        (3, 48, 1024, KW.KWConfig(16, 64, 2, prefetch=0)),
        (4, 40, 512, KW.KWConfig(8, 64, 1, num_warps=2)),
        (1, 33, 1024, KW.KWConfig(16, 32, 4)),  # four splits, row tail
        (2, 40, 768, KW.KWConfig(16, 32, 1, prefetch=2)),  # ping-pong, odd trip count (3; q8 6)
        (3, 48, 1024, KW.KWConfig(16, 32, 2, prefetch=2)),  # ping-pong, even trip count, two splits
        (2, 40, 768, KW.KWConfig(32, 16, 2, prefetch=2)),  # ping-pong, odd trips in each of two splits
        # ragged K shares (the trips do not divide): 9 trips as 5 + 4, 17 as 5 + 5 + 5 + 2
        (1, 40, 1152, KW.KWConfig(16, 16, 2, num_warps=2)),
        (3, 40, 1152, KW.KWConfig(16, 32, 2, prefetch=2)),  # q8
        (2, 33, 2176, KW.KWConfig(16, 16, 4, num_warps=2, prefetch=2)),  # row tail
        (4, 40, 2176, KW.KWConfig(8, 32, 4, num_warps=2)),  # q8
        (2, 40, 768, KW.KWConfig(16, 32, 1, prefetch=2, pin=True)),  # pinned loads (a no-op when interpreted)
        # the grid's last row blocks in K shares (row tail in the tail; a tail of every block; ping-pong)
        (1, 70, 512, KW.KWConfig(16, 32, tail=2, tail_splits=2)),
        (3, 48, 1152, KW.KWConfig(16, 16, num_warps=2, tail=1, tail_splits=2)),  # ragged: 9 trips as 5 + 4
        (2, 40, 1024, KW.KWConfig(8, 32, num_warps=2, prefetch=2, tail=9, tail_splits=4)),
        (4, 64, 2176, KW.KWConfig(16, 16, num_warps=2, tail=3, tail_splits=4)),
    ],
)
def test_interpreted_kw_matches_reference(scheme, m, n, k, cfg):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    if not KW.supports(p, cfg):
        pytest.skip(f"{cfg.describe()} does not fit format {p.fmt} at K={k}")
    K.Workspace.get(torch.device("cpu")).reserve(*KW.workspace_need(p, cfg))
    y = KW.launch(x, p, cfg)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x.float() @ deq.T) < 6e-3
    # the same partials, summed in another order: gemv_h2's result within rounding
    h2 = H.H2Config(16, 2, 1)
    if H.supports(p, h2):
        assert rel_err(y, H.launch(x, p, h2).float()) < 6e-3
    assert int(K.Workspace.get(torch.device("cpu")).counters.abs().sum()) == 0


# --- the fast path's plumbing on the CPU, the PTX emulated ---------------------------------------


@triton.jit
def _lead(v, C: tl.constexpr, N: tl.constexpr):
    """Each run's first word's value, spread over the run's four words (the PTX reads a run's
    scales and bit words from its first word only)."""
    v3 = tl.reshape(v, (C // 4, 4, N))
    lane = tl.arange(0, 4)[None, :, None]
    r = tl.sum(tl.where(lane == 0, v3, tl.zeros_like(v3)), 1)
    return tl.reshape(tl.broadcast_to(r[:, None, :], (C // 4, 4, N)), (C, N))


@triton.jit
def _emu_row(w, hl, hh, jj, s_lo, s_hi, xa, xb, xc, xd, FMT: tl.constexpr):
    """One x row's products a word, from the pairs as the PTX takes them (their factors undone)."""
    if FMT == 5:
        kb, kc, kd = 16.0, 2.0, 32.0
    elif FMT == 4 or FMT == 6:
        kb, kc, kd = 16.0, 1.0, 16.0
    else:
        kb, kc, kd = 1.0, 1.0, 1.0
    xa, xb, xc, xd = H._bx(xa, w), H._bx(xb, w), H._bx(xc, w), H._bx(xd, w)
    a0, b0 = H._plain_codes(w, 0, hl, hh, jj, FMT)
    a1, b1 = H._plain_codes(w, 1, hl, hh, jj, FMT)
    a2, b2 = H._plain_codes(w, 2, hl, hh, jj, FMT)
    a3, b3 = H._plain_codes(w, 3, hl, hh, jj, FMT)
    lo = a0 * KW._half(xa, False) + a1 * KW._half(xc, False) * kc + a2 * KW._half(xa, True) + a3 * KW._half(xc, True) * kc
    v = lo * s_lo
    if FMT != 8:
        hi = (b0 * KW._half(xb, False) * kb + b1 * KW._half(xd, False) * kd + b2 * KW._half(xb, True) * kb
              + b3 * KW._half(xd, True) * kd)
        v = v + hi * s_hi
    if FMT == 16:
        v = v * 2.384185791015625e-07  # the PTX's NVFP4 sums carry 2^-22 (gemv_h2.NVFP4_UNDO)
    return v


@triton.jit
def _emu_dot_out(w, hl, hh, s, h_shift, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1, xa2, xb2, xc2, xd2, xa3, xb3, xc3, xd3,
                 FMT: tl.constexpr, BLOCK_M: tl.constexpr, ASM: tl.constexpr, CONSTR: tl.constexpr):
    """gemv_h2._dot_out's contract in plain Triton: lane m of each run of four words holds x row
    m's partial of the run (zero past BLOCK_M); scales and bit words from the run's first word."""
    C: tl.constexpr = w.shape[0]
    N: tl.constexpr = w.shape[1]
    jj = (tl.arange(0, C) % 4)[:, None]
    if FMT == 8:
        s_lo = _lead(s.to(tl.float32), C, N)
        s_hi = s_lo
    elif FMT == 16:
        sl = _lead(s.to(tl.int32) & 0xFFFF, C, N)
        s_lo = H._e4m3((sl >> (8 * (jj // 2))) & 0xFF)
        s_hi = s_lo
    else:
        sl = _lead(s, C, N)
        s_lo = (sl & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        s_hi = ((sl >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    if FMT == 5 or FMT == 6:
        sh = _lead(tl.broadcast_to(h_shift[:, None], w.shape), C, N)
        hl = _lead(hl, C, N) >> sh
        hh = _lead(hh, C, N) >> sh
    lane = tl.arange(0, 4)[None, :, None]
    out = tl.zeros((C // 4, 4, N), tl.float32)
    r = tl.sum(tl.reshape(_emu_row(w, hl, hh, jj, s_lo, s_hi, xa0, xb0, xc0, xd0, FMT), (C // 4, 4, N)), 1)
    out = tl.where(lane == 0, tl.broadcast_to(r[:, None, :], out.shape), out)
    if BLOCK_M > 1:
        r = tl.sum(tl.reshape(_emu_row(w, hl, hh, jj, s_lo, s_hi, xa1, xb1, xc1, xd1, FMT), (C // 4, 4, N)), 1)
        out = tl.where(lane == 1, tl.broadcast_to(r[:, None, :], out.shape), out)
    if BLOCK_M > 2:
        r = tl.sum(tl.reshape(_emu_row(w, hl, hh, jj, s_lo, s_hi, xa2, xb2, xc2, xd2, FMT), (C // 4, 4, N)), 1)
        out = tl.where(lane == 2, tl.broadcast_to(r[:, None, :], out.shape), out)
        r = tl.sum(tl.reshape(_emu_row(w, hl, hh, jj, s_lo, s_hi, xa3, xb3, xc3, xd3, FMT), (C // 4, 4, N)), 1)
        out = tl.where(lane == 3, tl.broadcast_to(r[:, None, :], out.shape), out)
    return tl.reshape(out, (C, N))


@interp
@pytest.mark.parametrize("scheme", ["q5_g64", "nvfp4"])
@pytest.mark.parametrize("m,n,k,cfg", [(1, 70, 512, KW.KWConfig(16, 32)), (4, 40, 384, KW.KWConfig(32, 16, 1, prefetch=2)),
                                       (3, 48, 512, KW.KWConfig(16, 32, 2, inline=True)),
                                       (2, 40, 768, KW.KWConfig(16, 32, 1, prefetch=2))])
def test_interpreted_fast_path_with_the_ptx_emulated(scheme, m, n, k, cfg, monkeypatch):
    """The fast path as compiled for the GPU (x pair operands and INV a trip, the [BW, BLOCK_N]
    accumulator and its one reduction, first-word-only scale and bit-word loads, the ping-pong
    walk, the splits), with the PTX of gemv_h2._dot_out replaced by an emulation of its contract:
    the plain path's result within rounding. An INV one word off gives errors near 1."""
    monkeypatch.setattr(H, "_dot_out", _emu_dot_out)
    monkeypatch.setattr(KW, "EMULATED_DOT", True)
    g = torch.Generator().manual_seed(m * 100 + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    K.Workspace.get(torch.device("cpu")).reserve(*KW.workspace_need(p, cfg))
    y = KW.launch(x, p, cfg)
    assert rel_err(y, x.float() @ deq.T) < 6e-3
    monkeypatch.setattr(KW, "EMULATED_DOT", False)
    assert rel_err(y, KW.launch(x, p, cfg).float()) < 6e-3
    assert int(K.Workspace.get(torch.device("cpu")).counters.abs().sum()) == 0


@interp
@pytest.mark.parametrize("scheme", ["q5_g64", "nvfp4"])
def test_interpreted_kw_gated_input_is_silu_mul_then_the_gemv(scheme):
    """gated: [gate | up] rows inside a wider buffer (any row stride), the GEMV's input
    silu(gate) * up rounded once to bf16 as the pairs are prepared: the silu_mul launch's x,
    so the same output bit for bit."""
    from ninfer_plugins.cuda_fast.ops import silu_mul

    g = torch.Generator().manual_seed(5)
    k = 512
    p, deq = packed_and_ref(torch.randn(48, k, generator=g), scheme)
    wide = (torch.randn(2, 2 * k + 64, generator=g) * 3).to(torch.bfloat16)
    gu = wide[:, : 2 * k]
    act = silu_mul(gu[:, :k], gu[:, k:])
    y = KW.launch(gu, p, KW.KWConfig(16, 32), gated=True)
    assert torch.equal(y, KW.launch(act, p, KW.KWConfig(16, 32)))
    assert torch.equal(y, KW.launch(gu, p, KW.KWConfig(16, 32, inline=True), gated=True))
    assert rel_err(y, act.float() @ deq.T) < 6e-3


@interp
@pytest.mark.parametrize("scheme", ["q5_g64", "q8_g32"])
@pytest.mark.parametrize("m,n,k,cfg", [(1, 70, 512, KW.KWConfig(16, 32, inline=True)),
                                       (3, 48, 512, KW.KWConfig(16, 32, 2, prefetch=2, inline=True))])
def test_interpreted_inline_x_pairs(scheme, m, n, k, cfg):
    """inline: x's pairs made by the GEMV's own first CTA (the interpreter runs programs in order)
    instead of a launch of their own: the same pairs, so the same result bit for bit; both counters
    back at 0 (a second launch relies on it)."""
    g = torch.Generator().manual_seed(m + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    K.Workspace.get(torch.device("cpu")).reserve(*KW.workspace_need(p, cfg))
    want = KW.launch(x, p, dataclasses.replace(cfg, inline=False))
    for _ in range(2):
        assert torch.equal(KW.launch(x, p, cfg), want)
        assert int(KW.ready_counters(torch.device("cpu")).abs().sum()) == 0
    assert rel_err(want, x.float() @ deq.T) < 6e-3


@interp
def test_interpreted_kw_large_and_tiny_x():
    """x of huge and tiny scale, and one K block far larger than the rest: the per-block
    power-of-two scaling keeps each block's x exact to fp16."""
    g = torch.Generator().manual_seed(7)
    p, deq = packed_and_ref(torch.randn(32, 512, generator=g), "q6_g64")
    for scale in (3e4, 1e-6):
        x = (torch.randn(1, 512, generator=g) * scale).to(torch.bfloat16)
        assert rel_err(KW.launch(x, p, KW.KWConfig(16, 32)), x.float() @ deq.T) < 6e-3
    x = torch.randn(1, 512, generator=g)
    x[:, 128:256] *= 1e4
    x = x.to(torch.bfloat16)
    assert rel_err(KW.launch(x, p, KW.KWConfig(16, 32)), x.float() @ deq.T) < 6e-3


@interp
@pytest.mark.parametrize("fmt,scheme", [(4, "q4_g64"), (5, "q5_g64"), (8, "q8_g32"), (16, "nvfp4")])
def test_interpreted_xpairs_follow_gemv_h2s_rules(fmt, scheme):
    """Each K block's pairs: x * 2^e (e from the block's max |x|, gemv_h2's HEAD) times the
    decode's factor for that pair (gemv_h2.X_FACTORS), rounded to fp16; INVM = 2^-e; INV[c] the
    1/scale of row c % 4 (NVFP4: with 2^22)."""
    g = torch.Generator().manual_seed(fmt)
    k = 256
    x = (torch.randn(3, k, generator=g) * torch.tensor([1.0, 50.0, 1e-3])[:, None]).to(torch.bfloat16)
    xp, inv, invm = KW.xpairs(x, fmt, k, 4, fast=False)
    kw = KW.row_words(fmt, k)
    wpb = KW.WORDS[fmt]
    pairs = xp.view(4, 4, kw)
    fa, fb, fc, fd = H.X_FACTORS[fmt]
    hi = H.HI_OFFSET[fmt]
    for m in range(4):
        for kb in range(k // 128):
            blk = x[m, kb * 128:(kb + 1) * 128].float() if m < 3 else torch.zeros(128)
            amax = float(blk.abs().max())
            ex = (torch.tensor([amax]).view(torch.int32).item() >> 23 & 0xFF) - 127
            e = H.HEAD[fmt] - min(max(ex, -100), 100)
            assert float(invm.view(4, -1)[m, kb]) == 2.0 ** -e
            undo = 22 if fmt == 16 else 0
            for t in range(wpb):
                c = kb * wpb + t
                base = kb * 128 + ((t // 2) * 16 + (t % 2) * 4 if fmt == 16 else t * 4)
                if c % 4 == m:
                    assert float(inv[c]) == 2.0 ** (undo - e)
                xv = torch.zeros(k) if m >= 3 else x[m].float()
                lo = [xv[base + i] * 2.0 ** e for i in range(4)]
                hv = [xv[base + (0 if fmt == 8 else hi) + i] * 2.0 ** e for i in range(4)]
                want = {0: (lo[0] * fa, lo[2] * fa), 1: (hv[0] * fb, hv[2] * fb), 2: (lo[1] * fc, lo[3] * fc),
                        3: (hv[1] * fd, hv[3] * fd)}
                for part, (a, b) in want.items():
                    if fmt == 8 and part in (1, 3):
                        continue  # q8 has no high group: its decode reads pairs A and C only
                    word = int(pairs[m, part, c])
                    got = torch.tensor([word & 0xFFFF, (word >> 16) & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.float16)
                    assert torch.equal(got, torch.tensor([float(a), float(b)]).to(torch.float16)), (m, kb, t, part)


def test_tail_configs_fit_and_describe():
    # gate+up (K = 5120) at BW 128: 5 trips, so 2 shares (3 + 2), not 4 (2 + 2 + 1 + 0)
    assert KW._fits(4, 5120, KW.KWConfig(16, 128, tail=64, tail_splits=2))
    assert not KW._fits(4, 5120, KW.KWConfig(16, 128, tail=64, tail_splits=4))
    assert KW._fits(4, 5120, KW.KWConfig(16, 64, tail=64, tail_splits=4))  # 10 trips: 3 + 3 + 3 + 1
    assert not KW._fits(4, 5120, KW.KWConfig(16, 128, 2, tail=64, tail_splits=2))  # not with K shares already
    assert not KW._fits(4, 5120, KW.KWConfig(16, 128, inline=True, tail=64, tail_splits=2))
    assert not KW._fits(4, 5120, KW.KWConfig(16, 64, tail=64, tail_splits=3))  # powers of two
    assert not KW._fits(4, 5120, KW.KWConfig(16, 128, tail=64))  # a tail needs its shares
    assert KW.KWConfig(16, 128, tail=64, tail_splits=2).describe() == "KW BN16 BW128 S1 w4 pf T64x2"
    p = types.SimpleNamespace(n=34816)
    assert KW.workspace_need(p, KW.KWConfig(16, 128, tail=64, tail_splits=2)) == (2 * KW.MAX_M * 34816, 2176)


def test_kw_refuses_bad_inputs():
    g = torch.Generator().manual_seed(1)
    p, _ = packed_and_ref(torch.randn(32, 256, generator=g), "q4_g64")
    x = torch.randn(5, 256).to(torch.bfloat16)
    with pytest.raises(ValueError, match="at most 4 rows"):
        KW.launch(x, p, KW.KWConfig(16, 32))
    with pytest.raises(ValueError, match="multiple of BW"):
        KW.launch(x[:1], p, KW.KWConfig(16, 64, 2))  # 32 words a row, 64 x 2 a trip
    with pytest.raises(ValueError, match="power of two"):
        KW.launch(x[:1], p, KW.KWConfig(16, 32, 3))
    with pytest.raises(ValueError, match="unit last stride"):
        KW.launch(torch.randn(1, 300).to(torch.bfloat16), p, KW.KWConfig(16, 32))


def test_kw_dispatch_only_when_switched_on(monkeypatch):
    """NINFER_KW=1: every M <= 4 launch the K-walk fits goes to it (its default config); off, the
    dispatch is untouched; M > 4 never (the measured table emptied: its entries come first)."""
    from ninfer_plugins.quant_int import tuned

    monkeypatch.setenv("NINFER_TKW", "0")  # TUNED_TKW's winners come first; here the K-walk's own dispatch

    monkeypatch.setattr(tuned, "TUNED_KW", {})
    monkeypatch.delenv("NINFER_KW", raising=False)
    assert not isinstance(K.pick_gemv(5, 1, 5120, 17408, 132), KW.KWConfig)
    monkeypatch.setenv("NINFER_KW", "1")
    for m in (1, 2, 4):
        assert K.pick_gemv(5, m, 5120, 17408, 132) == KW.KWConfig(16, 128, 1)
    assert not isinstance(K.pick_gemv(5, 8, 5120, 17408, 132), KW.KWConfig)
    # 2048 rows are 128 row blocks: K shares until two CTAs an SM (128 x 4 >= 264)
    assert K.pick_gemv(8, 1, 2048, 4096, 132) == KW.KWConfig(16, 128, 4)
    # 640 words a row (K = 5120) are 5 trips: two shares of 3 and 2 (ragged); four would leave one
    # share without a trip
    assert KW.default_config(4, 2048, 5120, 132) == KW.KWConfig(16, 128, 2)
    assert not KW._fits(4, 5120, KW.KWConfig(16, 128, 4)) and KW._fits(4, 5120, KW.KWConfig(16, 128, 2))
    # 3 K blocks: 48 words a row, only BW 16... none fits BW 32 (48 % 32): no config
    assert KW.default_config(4, 256, 384, 132) is None


def test_tuned_kw_winners_dispatch_unless_switched_off(monkeypatch):
    """A TUNED_KW entry is dispatched at its M bucket (m1: M = 1, m4: M = 2..4) without NINFER_KW;
    () means the K-walk lost there (the dispatch goes on as before); NINFER_KW=0 turns the table
    off."""
    from ninfer_plugins.quant_int import tuned

    monkeypatch.setenv("NINFER_TKW", "0")  # TUNED_TKW's winners come first; here the K-walk's own dispatch

    monkeypatch.setattr(tuned, "TUNED_KW", {})
    monkeypatch.delenv("NINFER_KW", raising=False)
    before = {m: K.pick_gemv(5, m, 5120, 17408, 132) for m in (1, 2, 4)}
    monkeypatch.setitem(tuned.TUNED_KW, (5, 5120, 17408, "m1"), (16, 128, 1, 4, 2))
    monkeypatch.setitem(tuned.TUNED_KW, (5, 5120, 17408, "m4"), ())
    assert K.pick_gemv(5, 1, 5120, 17408, 132) == KW.KWConfig(16, 128, 1, 4, 2)
    assert K.pick_gemv(5, 2, 5120, 17408, 132) == before[2] and K.pick_gemv(5, 4, 5120, 17408, 132) == before[4]
    monkeypatch.setenv("NINFER_KW", "0")
    assert K.pick_gemv(5, 1, 5120, 17408, 132) == before[1]
    monkeypatch.setenv("NINFER_KW", "1")
    # the experiment switch: the default config where the table says () too
    assert K.pick_gemv(5, 4, 5120, 17408, 132) == KW.KWConfig(16, 128, 1)


def test_tuned_kw_table_entries_fit():
    from ninfer_plugins.quant_int.tuned import TUNED_KW, TUNED_KW_TRY

    for (fmt, n, k, bucket), cfg in [*TUNED_KW.items(), *TUNED_KW_TRY.items()]:
        assert bucket in ("m1", "m4")
        if cfg:
            assert KW._fits(fmt, k, KW.KWConfig(*cfg)), (fmt, n, k, cfg)


def test_kw_try_switch_puts_candidates_first(monkeypatch):
    """NINFER_KW_TRY=1 dispatches TUNED_KW_TRY's candidates ahead of TUNED_KW and of the kernels
    dispatched without them (the 35B head's f16x2 GEMV); without it they are never picked; the
    load-time reservation counts them either way."""
    from ninfer_plugins.quant_int import tuned

    monkeypatch.setenv("NINFER_TKW", "0")
    for name in ("NINFER_KW", "NINFER_KW_TRY"):
        monkeypatch.delenv(name, raising=False)
    key = (6, 248320, 2048)
    monkeypatch.setattr(tuned, "TUNED_KW", {})
    monkeypatch.setattr(tuned, "TUNED_KW_TRY", {(*key, "m1"): (8, 128, 1, 2, 1, False)})
    before = {m: K.pick_gemv(6, m, *key[1:], 132) for m in (1, 4)}
    assert not isinstance(before[1], KW.KWConfig)
    monkeypatch.setenv("NINFER_KW_TRY", "1")
    assert K.pick_gemv(6, 1, *key[1:], 132) == KW.KWConfig(8, 128, 1, 2, 1, False)
    assert K.pick_gemv(6, 4, *key[1:], 132) == before[4]  # a bucket without a candidate: as before
    monkeypatch.setenv("NINFER_KW", "0")  # the K-walk off: its candidates too
    assert K.pick_gemv(6, 1, *key[1:], 132) == before[1]
    monkeypatch.setenv("NINFER_KW", "")
    monkeypatch.setenv("NINFER_KW_TRY", "0")
    assert K.pick_gemv(6, 1, *key[1:], 132) == before[1]


# --- GPU -------------------------------------------------------------------------------------------

GPU_SHAPES = [("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120), ("q5_g64", 5120, 6144),
              ("q8_g32", 12288, 2048), ("q8_g32", 2048, 4096), ("nvfp4", 5120, 17408), ("q6_g64", 2048, 5120)]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme,n,k", GPU_SHAPES)
def test_kw_fast_path_on_the_gpu(scheme, n, k):
    """Every config kind (pf, ping-pong with odd trips at K = 17408, splits, ragged splits: 17 trips
    as 9 + 8 or 5 + 5 + 5 + 2, pinned loads) at M = 1..4."""
    torch.manual_seed(n + k)
    p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
    deq = deq.float()
    for m in (1, 2, 3, 4):
        x = (torch.randn(m, k, device="cuda") * 2).to(torch.bfloat16)
        ref = x.float() @ deq.T
        for cfg in (KW.KWConfig(16, 128), KW.KWConfig(16, 128, 1, 4, 2), KW.KWConfig(32, 64, 2, 8), KW.KWConfig(16, 128, 4),
                    KW.KWConfig(16, 128, 1, 4, 2, inline=True), KW.KWConfig(16, 128, 4, inline=True),
                    KW.KWConfig(8, 128, 2, 2), KW.KWConfig(8, 128, 4, 2, 2),
                    # the next trip's loads pinned ahead of the math (a warp barrier)
                    KW.KWConfig(16, 128, 1, 4, 1, pin=True), KW.KWConfig(16, 128, 1, 4, 2, pin=True),
                    KW.KWConfig(8, 128, 2, 2, 1, pin=True),
                    # the last row blocks in K shares (gate+up's 64 of 2,176: 5 trips as 3 + 2; 10 trips in 4)
                    KW.KWConfig(16, 128, 1, 4, 2, tail=64, tail_splits=2), KW.KWConfig(16, 64, 1, 4, 1, tail=64, tail_splits=4),
                    KW.KWConfig(8, 128, 1, 2, 1, tail=13, tail_splits=2)):
            if not KW.supports(p, cfg):
                continue
            K.Workspace.get(x.device).reserve(*KW.workspace_need(p, cfg))
            y = KW.launch(x, p, cfg)
            assert rel_err(y, ref) < 6e-3, (m, cfg.describe())
            assert torch.equal(y, KW.launch(x, p, cfg))  # bit-equal repeats
            assert int(K.Workspace.get(x.device).counters.abs().sum()) == 0
            assert int(KW.ready_counters(x.device).abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_gpu_35b_kw_entries_match_the_reference(monkeypatch):
    """TUNED_KW entries past the table test's row limit or not timed alone (the 35B-A3B's 248,320-row
    q6 head and q8 q+k+v, the 27B MTP's 131,072-row q4 shortlist head; and whatever TUNED_KW_TRY
    holds, under NINFER_KW_TRY=1) at their own shapes, dispatched
    through kernels.launch at their M bucket: within rounding of dequantize-then-matmul, bit-equal
    on a repeat."""
    from ninfer_plugins.quant_int.tuned import TUNED_KW, TUNED_KW_TRY

    monkeypatch.setenv("NINFER_KW_TRY", "1")
    keys = [(6, 248320, 2048, "m1"), (6, 248320, 2048, "m4"), (8, 9216, 2048, "m1"), (8, 9216, 2048, "m4"),
            (4, 131072, 5120, "m1")]
    entries = {key: TUNED_KW[key] for key in keys} | TUNED_KW_TRY
    for (fmt, n, k, bucket), cfg in entries.items():
        if not cfg:
            continue
        torch.manual_seed(n + k)
        p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), SCHEME_OF[fmt])
        K.reserve_workspace(p)
        m = 1 if bucket == "m1" else 4
        assert K.pick_gemv(p.fmt, m, n, k, p.sm_count) == KW.KWConfig(*cfg)
        x = (torch.randn(m, k, device="cuda") * 2).to(torch.bfloat16)
        y = K.launch(x, p)
        assert rel_err(y, x.float() @ deq.float().T) < 6e-3, (fmt, n, k, bucket)
        assert torch.equal(y, K.launch(x, p))
        del p, deq


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme,n,k", [("q5_g64", 5120, 17408), ("nvfp4", 5120, 17408), ("q8_g32", 2048, 4096)])
def test_kw_through_the_engine_entry_in_a_graph(scheme, n, k, monkeypatch):
    """NINFER_KW=1: the dispatched decode (kernels.launch) and the gated down projection
    (TritonQuantLinear.apply_gated) run the K-walk GEMV, captured in a CUDA graph: the gated launch
    bit-equal to silu_mul then the dispatched GEMV, and both within rounding of gemv_h2's."""
    from ninfer_plugins.cuda_fast.ops import silu_mul
    from ninfer_plugins.quant_int.linear import TritonQuantLinear

    torch.manual_seed(6)
    p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
    K.reserve_workspace(p)
    gu = (torch.randn(1, 2 * k, device="cuda") * 2).bfloat16()
    act = silu_mul(gu[:, :k], gu[:, k:])
    h2 = K.launch(act, p)
    monkeypatch.setenv("NINFER_KW", "1")
    assert isinstance(K.pick_gemv(p.fmt, 1, n, k, p.sm_count), KW.KWConfig)
    kern = TritonQuantLinear.__new__(TritonQuantLinear)  # apply_gated reads nothing of the instance
    want = K.launch(act, p)
    assert rel_err(want, h2.float()) < 6e-3 and rel_err(want, act.float() @ deq.float().T) < 6e-3
    assert torch.equal(kern.apply_gated(gu, p), want)  # compiled outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kern.apply_gated(gu, p)
        y2 = K.launch(act, p)
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, want) and torch.equal(y2, want)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_kw_inline_pairs_over_many_graph_replays():
    """The inline x pairs (the GEMV's first CTAs produce, the others wait through
    ninfer.kernels.triton.sync): 300 replays of four launches back to back in one graph, the same
    bits every time and the ready counters back at zero."""
    torch.manual_seed(9)
    p, _ = packed_and_ref(torch.randn(5120, 17408, device="cuda", dtype=torch.bfloat16), "q5_g64")
    K.reserve_workspace(p)
    cfg = KW.KWConfig(16, 128, 1, 4, 2, inline=True)
    K.Workspace.get(p.device).reserve(*KW.workspace_need(p, cfg))
    x = torch.randn(1, 17408, device="cuda").bfloat16()
    want = KW.launch(x, p, cfg)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = [KW.launch(x, p, cfg) for _ in range(4)]
    for _ in range(300):
        g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(y, want) for y in ys)
    assert int(KW.ready_counters(x.device).abs().sum()) == 0


def test_measured_table_entries_fit_and_dispatch(monkeypatch):
    """Every TUNED_KW winner is a config the kernel takes for its shape, and is what the dispatch
    picks at its bucket (M = 1 for m1, M = 2..4 for m4) unless NINFER_KW=0."""
    from ninfer_plugins.quant_int import tuned

    monkeypatch.setenv("NINFER_TKW", "0")  # TUNED_TKW's winners come first; here the K-walk's own dispatch

    monkeypatch.delenv("NINFER_KW", raising=False)
    assert tuned.TUNED_KW, "the table holds kw_bench's measured winners"
    for (fmt, n, k, bucket), fields in tuned.TUNED_KW.items():
        ms = (1,) if bucket == "m1" else (2, 4)
        if not fields:
            assert all(not isinstance(K.pick_gemv(fmt, m, n, k, 132), KW.KWConfig) for m in ms)
            continue
        cfg = KW.KWConfig(*fields)
        assert KW._fits(fmt, k, cfg), (fmt, n, k, bucket, cfg)
        assert all(K.pick_gemv(fmt, m, n, k, 132) == cfg for m in ms)
    monkeypatch.setenv("NINFER_KW", "0")
    assert all(not isinstance(K.pick_gemv(fmt, 1, n, k, 132), KW.KWConfig) for fmt, n, k, _ in tuned.TUNED_KW)


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m,n,k,cfg", [
    (1, 40, 2176, KW.KWConfig(16, 16, 1, num_warps=2)),  # 17 trips: 16 asked ahead
    (2, 33, 2176, KW.KWConfig(16, 16, 4, num_warps=2, prefetch=2)),  # ragged shares, the last of 2 trips
    (3, 40, 1152, KW.KWConfig(16, 32, 2, prefetch=2)),  # q8
])
def test_l2_ahead_changes_nothing(scheme, m, n, k, cfg):
    """With a budget (NINFER_L2PF), each CTA asks the L2 for its next trips before waiting on the
    kernel before; interpreted, those lines are read and dropped. The output is bit-equal to the
    launch without, and the trips asked are what the budget gives."""
    from ninfer.kernels.triton import prefetch as PF

    g = torch.Generator().manual_seed(n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    if not KW.supports(p, cfg):
        pytest.skip(f"{cfg.describe()} does not fit format {p.fmt} at K={k}")
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    K.Workspace.get(torch.device("cpu")).reserve(*KW.workspace_need(p, cfg))
    trips = KW._share(KW.row_words(p.fmt, k) // cfg.bw, cfg.splits)
    ahead = KW.l2_ahead_trips(p, cfg, 1 << 30)
    assert ahead == max(s for s in PF.STEPS if s <= trips - 1) and ahead > 0
    assert KW.l2_ahead_trips(p, cfg, 0) == 0
    assert torch.equal(KW.launch(x, p, cfg, l2_budget=1 << 30), KW.launch(x, p, cfg, l2_budget=0))


def test_l2_trips_budget():
    from ninfer.kernels.triton import prefetch as PF

    assert PF.l2_trips(0, 100, 4096, 17) == 0  # off
    assert PF.l2_trips(24 << 20, 640, 4096, 17) == 8  # q5 down at BN 8: 9.6 trips' worth -> 8
    assert PF.l2_trips(24 << 20, 2176, 8192, 5) == 1  # q4 gate+up: 1.4 -> 1
    assert PF.l2_trips(1 << 40, 10, 4096, 3) == 2  # never past the share's own trips
    assert PF.l2_trips(1 << 40, 10, 4096, 1) == 0
    # resident CTAs: 16 warps of ~128 registers an SM, never more than the grid
    assert PF.resident(2176, 132, 4) == 528 and PF.resident(640, 132, 2) == 640 and PF.resident(5000, 132, 8) == 264


def test_l2_budget_from_the_environment(monkeypatch):
    from ninfer.kernels.triton import prefetch as PF

    monkeypatch.delenv("NINFER_L2PF", raising=False)
    assert PF.budget_bytes() == 0
    monkeypatch.setenv("NINFER_L2PF", "24")
    assert PF.budget_bytes() == 24 << 20
    monkeypatch.setenv("NINFER_L2PF", "lots")
    assert PF.budget_bytes() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme,n,k", [("q5_g64", 5120, 17408), ("q4_g64", 34816, 5120), ("q5_g64", 5120, 6144),
                                        ("q8_g32", 12288, 2048), ("nvfp4", 5120, 17408)])
def test_gpu_l2_ahead_bit_equal_in_a_graph(scheme, n, k, monkeypatch):
    """NINFER_L2PF at the real shapes: the dispatched decode GEMV (K-walk or f16x2) with its CTAs
    asking the L2 for their next trips gives the same bits as without, eager and replayed in a
    graph behind another launch (PDL on)."""
    torch.manual_seed(7)
    p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
    K.reserve_workspace(p)
    x = (torch.randn(1, k, device="cuda") * 2).bfloat16()
    monkeypatch.delenv("NINFER_L2PF", raising=False)
    want = K.launch(x, p)
    assert rel_err(want, x.float() @ deq.float().T) < 6e-3
    monkeypatch.setenv("NINFER_L2PF", "32")
    cfg = K.pick_gemv(p.fmt, 1, n, k, p.sm_count)
    ahead = (KW.l2_ahead_trips(p, cfg, 32 << 20) if isinstance(cfg, KW.KWConfig)
             else H.l2_ahead_trips(p, cfg, 32 << 20))
    assert ahead > 0, f"{cfg.describe()} asks nothing ahead at this shape"
    assert torch.equal(K.launch(x, p), want)

    def twice():
        K.launch(x, p)
        return K.launch(x, p)

    for y in replayed(twice, 3):
        assert torch.equal(y, want)


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k,cfg", [
    (40, 2176, KW.KWConfig(16, 16, 1, num_warps=2)),
    (33, 2176, KW.KWConfig(16, 16, 4, num_warps=2, prefetch=2)),  # ragged: 5 + 5 + 5 + 2 trips, a row tail
    (40, 1152, KW.KWConfig(16, 32, 2)),  # q8
])
def test_l2_ahead_addresses(scheme, n, k, cfg, monkeypatch):
    """Every address the CTAs ask the L2 for lies in the weight's words, bit words or scales, and
    the words asked are exactly each share's trips 2..L2PF+1, a line each (a recorder in
    l2_prefetch's place: the interpreter looks it up at each call)."""
    import numpy as np

    from ninfer.kernels.triton import prefetch as PF

    g = torch.Generator().manual_seed(n + k)
    p, _ = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    if not KW.supports(p, cfg):
        pytest.skip(f"{cfg.describe()} does not fit format {p.fmt} at K={k}")
    seen = []
    monkeypatch.setattr(PF, "l2_prefetch", lambda P, ASM: seen.append(np.asarray(P.handle.data).ravel().astype(np.int64)))
    K.Workspace.get(torch.device("cpu")).reserve(*KW.workspace_need(p, cfg))
    budget = 1 << 30
    ahead = KW.l2_ahead_trips(p, cfg, budget)
    KW.launch((torch.randn(1, k, generator=g)).to(torch.bfloat16), p, cfg, l2_budget=budget)
    addrs = np.unique(np.concatenate(seen))
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (p.qweight, p.qhigh, p.scales) if t is not None]
    assert all(any(lo <= a < hi for lo, hi in spans) for a in addrs.tolist())
    w = p.qweight.view(torch.int32)
    lo, row = w.data_ptr(), w.stride(0) * 4
    words = addrs[(addrs >= lo) & (addrs < lo + w.numel() * 4)] - lo
    trips = KW.row_words(p.fmt, k) // cfg.bw
    share = KW._share(trips, cfg.splits)
    want = set()
    for r in range(-(-n // cfg.block_n) * cfg.block_n):
        for s in range(cfg.splits):
            it0 = s * share
            n_it = min(share, trips - it0)
            for t in range(1, min(n_it, ahead + 1)):
                for line in range(max(1, cfg.bw * 4 // 128)):
                    want.add(r * row + ((it0 + t) * cfg.bw + line * 32) * 4)
    assert set(words.tolist()) == want


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_gpu_tuned_table_dispatch_agrees_with_the_kernels_it_replaced(monkeypatch):
    """Every TUNED_KW winner (the default dispatch since the H100 run) at its bucket's row counts,
    against the dispatch without the table (NINFER_KW=0) and the fp32 reference, eager and in a
    graph; the gated down projection too where the shape is a down (K > N). The heads are left out
    (1 GB each)."""
    from ninfer_plugins.cuda_fast.ops import silu_mul
    from ninfer_plugins.quant_int import tuned
    from ninfer_plugins.quant_int.linear import TritonQuantLinear

    monkeypatch.delenv("NINFER_KW", raising=False)
    monkeypatch.setenv("NINFER_TKW", "0")  # TUNED_TKW's winners come first where both tables have one
    kern = TritonQuantLinear.__new__(TritonQuantLinear)
    for (fmt, n, k, bucket), fields in sorted(tuned.TUNED_KW.items()):
        if not fields or n > 65536:
            continue
        torch.manual_seed(n + k)
        p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), SCHEME_OF[fmt])
        K.reserve_workspace(p)
        for m in ((1,) if bucket == "m1" else (2, 4)):
            x = (torch.randn(m, k, device="cuda") * 2).bfloat16()
            assert K.pick_gemv(p.fmt, m, n, k, p.sm_count) == KW.KWConfig(*fields)
            y = K.launch(x, p)
            monkeypatch.setenv("NINFER_KW", "0")
            base = K.launch(x, p)
            monkeypatch.delenv("NINFER_KW")
            what = (fmt, n, k, m)
            assert rel_err(y, base.float()) < 1e-2 and rel_err(y, x.float() @ deq.float().T) < 6e-3, what
            for yg in replayed(lambda x=x, p=p: K.launch(x, p), 1):
                assert torch.equal(yg, y), what
            if k > n:
                gu = (torch.randn(m, 2 * k, device="cuda") * 2).bfloat16()
                assert torch.equal(kern.apply_gated(gu, p), K.launch(silu_mul(gu[:, :k], gu[:, k:]), p)), what
        del p, deq
        torch.cuda.empty_cache()


def test_pin_switch_pins_the_dispatched_config(monkeypatch):
    """NINFER_PIN=1 (an A/B switch, read at each launch) returns the dispatched f16x2 / K-walk
    config with its next tile's loads pinned, and nothing else changed."""
    monkeypatch.delenv("NINFER_PIN", raising=False)
    shapes = [(5, 1, 5120, 17408), (4, 1, 34816, 5120), (8, 1, 12288, 2048), (5, 1, 5120, 6144)]
    plain = [K.pick_gemv(*s, 132) for s in shapes]
    assert all(c is not None and not c.pin for c in plain)
    monkeypatch.setenv("NINFER_PIN", "1")
    for s, c in zip(shapes, plain):
        got = K.pick_gemv(*s, 132)
        assert got.pin and dataclasses.replace(got, pin=False) == c, (s, got, c)


# --- x's pairs made once an x (NINFER_KW_XREUSE=1): by the norm, reused by the next launch ---------


def _scratch_after(fn, device, fmt, k):
    """x_scratch(fmt, k) of `device` (the tensors' own: "cuda:0", not "cuda", names the scratch
    the kernels use) filled with a sentinel, then fn(): a copy of what it holds."""
    scratch = KW.x_scratch(device, fmt, k)
    for t in scratch:
        t.fill_(-7)
    fn()
    return [t.clone() for t in scratch]


@pytest.mark.parametrize("fmt", [4, 5, 8, 16])
@pytest.mark.parametrize("n,k", [(1, 640), (2, 384), (4, 1152), (1, 5120)])  # 5120: the 27B's rows (40 of 64 blocks)
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_pairs_is_rmsnorm_then_xpairs(fmt, n, k, with_residual):
    # the norm's output to the bit (residual updated alike), and the pairs it leaves in x_scratch
    # equal to the x-pairs launch's on that output, every word, scale and 1/scale it writes
    from ninfer.kernels.triton.norms import rmsnorm

    x, w, res_a, res_b = norm_inputs(n, k, n * 100 + k + fmt, with_residual, DEV)
    fast = not INTERPRET
    out = {}
    fused = _scratch_after(lambda: out.setdefault("h", KW.norm_pairs(x, w, 1e-6, fmt, residual=res_a, fast=fast)),
                           x.device, fmt, k)
    assert not torch.equal(fused[0], torch.full_like(fused[0], -7))  # the scratch the kernel wrote
    h = out["h"]
    want = rmsnorm(x, w, 1e-6, residual=res_b)
    assert torch.equal(h, want)
    if res_a is not None:
        assert torch.equal(res_a, res_b)
    apart = _scratch_after(lambda: KW.xpairs(h, fmt, k, n, fast), x.device, fmt, k)
    for got, exp in zip(fused, apart):
        assert torch.equal(got, exp)


@pytest.mark.parametrize("fmt", [4, 5, 6, 8, 16])
@pytest.mark.parametrize("n,k,kb_per", [(1, 640, 1), (2, 384, 2), (4, 1152, 4), (1, 5120, 1), (1, 2048, 8)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_spread_norm_pairs_are_rmsnorm_then_xpairs(fmt, n, k, kb_per, with_residual):
    # the spread form (NINFER_NORM_PAIRS=1) to the bit: its norm equal to rmsnorm's, its residual
    # sum (a new tensor; the residual given is left as it was) equal to rmsnorm's in-place one, and
    # every word, scale and 1/scale of x_scratch equal to the x-pairs launch's on its norm; K blocks
    # a program that do not divide the row's (1152: 9 blocks in programs of 4) included
    from ninfer.kernels.triton.norms import rmsnorm

    x, w, res_a, res_b = norm_inputs(n, k, n * 1000 + k + fmt, with_residual, DEV)
    before = None if res_a is None else res_a.clone()
    fast = not INTERPRET
    out = {}
    fused = _scratch_after(
        lambda: out.setdefault("sh", KW.norm_pairs_spread(x, w, 1e-6, fmt, residual=res_a, fast=fast, kb_per=kb_per)),
        x.device, fmt, k)
    s, h = out["sh"]
    want = rmsnorm(x, w, 1e-6, residual=res_b)
    assert torch.equal(h, want)
    if res_a is None:
        assert s is None
    else:
        assert torch.equal(res_a, before)  # not written
        assert s.data_ptr() != res_a.data_ptr() and torch.equal(s, res_b)
    apart = _scratch_after(lambda: KW.xpairs(h, fmt, k, n, fast), x.device, fmt, k)
    for got, exp in zip(fused, apart):
        assert torch.equal(got, exp)


@pytest.mark.parametrize("fmt", [5, 8, 16])
@pytest.mark.parametrize("slots", [[0], [2, -1], [1, 3, 0, 2]])
def test_gdn_step_writes_the_next_gemvs_pairs(fmt, slots):
    # gdn_decode_step's out_pairs (NINFER_NORM_PAIRS=1: out_proj's x pairs made by the step, one
    # value head a K block): the step's output and states to the bit as without, and x_scratch
    # equal to the x-pairs launch's on that output; a padded row (slot -1) gets its zeros' pairs
    from ninfer.kernels.triton import gdn_decode_step
    from ninfer.kernels.triton.gdn import OutPairs

    B, HK, HV, DK, DV = len(slots), 1, 3, 32, 128
    g = torch.Generator().manual_seed(fmt * 10 + B)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEV)

    C = 2 * HK * DK + HV * DV
    cw, cs = rnd(C, 4, scale=0.5).bfloat16(), rnd(4, C, 3).bfloat16()
    ss, alog, dtb = rnd(4, HV, DK, DV, scale=0.1), rnd(HV, scale=0.5), rnd(HV, scale=0.5)
    nw = (1 + rnd(DV, scale=0.1)).bfloat16()
    x, a, b, z = rnd(B, C).bfloat16(), rnd(B, HV, scale=3).bfloat16(), rnd(B, HV).bfloat16(), rnd(B, HV * DV).bfloat16()
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    k = HV * DV
    fast = not INTERPRET
    xp, inv, invm = KW.x_scratch(x.device, fmt, k)
    pairs = OutPairs(fn=KW._xpairs_blocks, xp=xp, inv=inv, invm=invm, kw=KW.row_words(fmt, k), nkb=k // 128, fmt=fmt,
                     head=H.HEAD[fmt], asm=fast)

    def step(with_pairs):
        c, s = cs.clone(), ss.clone()
        o = gdn_decode_step(x, a, b, cw, c, alog, dtb, s, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV,
                            state_indices=idx, z=z, norm_weight=nw, out_pairs=pairs if with_pairs else None)
        return o, c, s

    out = {}
    fused = _scratch_after(lambda: out.setdefault("with", step(True)), x.device, fmt, k)
    plain = step(False)
    for got, exp in zip(out["with"], plain):
        assert torch.equal(got, exp)
    o2 = plain[0].reshape(B, k)
    apart = _scratch_after(lambda: KW.xpairs(o2, fmt, k, B, fast), x.device, fmt, k)
    n_words = B * 4 * KW.row_words(fmt, k)  # XP rows past B: not the step's (xpairs writes only B too)
    assert torch.equal(fused[0][:n_words], apart[0][:n_words])
    for got, exp in zip(fused[1:], apart[1:]):
        assert torch.equal(got, exp)


@pytest.mark.parametrize("fn", ["norm_pairs", "norm_pairs_spread"])
def test_norm_pairs_refuse_what_the_gemv_does_not_take(fn):
    norm = getattr(KW, fn)
    x = torch.zeros(3, 256, dtype=torch.bfloat16, device=DEV)
    w = torch.zeros(256, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="1, 2 or 4 rows"):
        norm(x, w, 1e-6, 4)
    with pytest.raises(ValueError, match="1, 2 or 4 rows"):
        norm(torch.zeros(1, 200, dtype=torch.bfloat16, device=DEV), w[:200], 1e-6, 4)
    with pytest.raises(ValueError, match="residual of x's shape"):
        norm(x[:2], w, 1e-6, 4, residual=torch.zeros(2, 128, dtype=torch.bfloat16, device=DEV))
    if fn == "norm_pairs_spread":
        with pytest.raises(ValueError, match="power of two"):
            norm(x[:1], w, 1e-6, 4, kb_per=3)


@interp
@pytest.mark.parametrize("scheme", ["q4_g64", "q8_g32"])
@pytest.mark.parametrize("mode", ["no_grad", "inference"])
def test_launches_reuse_pairs_only_of_the_same_unchanged_x(scheme, mode, monkeypatch):
    # NINFER_KW_XREUSE=1: a launch on the norm's output, or again on the same x, makes no pairs;
    # a changed x (in place, where torch counts it), another tensor, other rows, a new epoch (a
    # capture or replay happened) or the switch off make them again. Every result equals the
    # launch that makes its own pairs. "inference": under torch.inference_mode, as the engine's
    # steps run (no version counters, views without a _base).
    from ninfer.kernels.epoch import new_epoch

    g = torch.Generator().manual_seed(11)
    n, k = 40, 512
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    cfg = KW.KWConfig(16, 32)
    made = count_launches(monkeypatch, KW, "_xpairs_kernel")
    monkeypatch.setenv("NINFER_KW_XREUSE", "1")
    x = (torch.randn(1, k, generator=g) * 3).to(torch.bfloat16)
    w = (torch.randn(k, generator=g) * 0.2).to(torch.bfloat16)

    def check(y, x_in):
        assert rel_err(y, x_in.float() @ deq.T) < 6e-3

    with torch.inference_mode() if mode == "inference" else torch.no_grad():
        h = KW.norm_pairs(x, w, 1e-6, p.fmt)
        check(KW.launch(h, p, cfg), h)
        check(KW.launch(h.reshape(1, k), p, cfg), h)  # a view of it: still its pairs
        assert made == []
        if mode == "no_grad":
            h.mul_(2)  # changed in place: its version moved
            check(KW.launch(h, p, cfg), h)
            assert len(made) == 1
        else:
            made.append("skipped")  # an inference tensor keeps no version: nothing to see
        check(KW.launch(h, p, cfg), h)  # made by that launch (or the norm), noted: reused
        assert len(made) == 1
        other = h.clone()
        check(KW.launch(other, p, cfg), other)
        assert len(made) == 2
        h2 = torch.cat([h, h])
        check(KW.launch(h2, p, cfg), h2)  # other rows
        assert len(made) == 3
        check(KW.launch(h2, p, cfg), h2)
        assert len(made) == 3
        new_epoch()  # a capture or a replay: what the host noted may no longer be there
        check(KW.launch(h2, p, cfg), h2)
        assert len(made) == 4
        monkeypatch.setenv("NINFER_KW_XREUSE", "0")
        monkeypatch.setenv("NINFER_NORM_PAIRS", "0")  # on by default: it keeps the notes too
        h = KW.norm_pairs(x, w, 1e-6, p.fmt)
        check(KW.launch(h, p, cfg), h)
        assert len(made) == 5 and KW._HELD == {}
