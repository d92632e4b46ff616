"""The tensor-core K-walk GEMV (quant_int/gemv_tkw.py, Gluon) against dequantize-then-matmul.

CPU (CI): x's preparation (a Triton kernel, interpreted) equals `xq_reference` exactly, and
unscrambled it is x scaled by a power of two and the decode's factors; the prepared sums undo
the decode's bias; the torch `reference` (the CPU path) against the fp32 oracle, gated too;
configs, shares and the dispatch switch. GPU (`-m gpu`): the 27B/35B q4/q5 shapes at M = 1..8
and several configs (one and two blocks ahead, 1-8 warps, K shares incl. ragged ones), a zero
and a large row, gated input, CUDA-graph replay bit-equal to eager with PDL on and off.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # as the other quant_int tests: Triton must see this before its import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ninfer_plugins.quant_int import gemv_h2 as H  # noqa: E402
from ninfer_plugins.quant_int import gemv_tc as TC  # noqa: E402
from ninfer_plugins.quant_int import gemv_tkw as TK  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from test_gemv_h2 import count_launches, norm_inputs, packed_and_ref, rel_err, replayed  # noqa: E402  (same folder)

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (CUDA and TC.HAVE_GLUON), reason="needs a GPU and Triton's Gluon")
DEV = "cuda" if CUDA else "cpu"


def _unscramble(q: torch.Tensor, k: int) -> torch.Tensor:
    """XQ back to [8 tokens, k] in element order (the inverse of the kernel's scatter)."""
    nkb = k // 128
    t = q.float().cpu().reshape(nkb, 2, 2, 8, 4, 2, 2, 2)  # [kb, grp, jh, n, t, jl, sel, half]
    return t.permute(3, 0, 1, 4, 2, 5, 7, 6).reshape(8, k)  # [n, kb, grp, t, jh, jl, half, sel]


@pytest.mark.parametrize("fmt", [4, 5])
@pytest.mark.parametrize("m,k", [(1, 128), (3, 384), (8, 256), (5, 640)])
def test_xq_kernel_matches_reference_exactly(fmt, m, k):
    g = torch.Generator().manual_seed(fmt * 100 + m + k)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    if m >= 3:
        x[1] = 0  # a zero row
        x[2, :128] *= 1000  # one block large, the next ones not: per-block scaling
    q, s = TK.xq(x.to(DEV), fmt, k)
    rq, rs = TK.xq_reference(x, fmt, k)
    assert torch.equal(q.cpu(), rq)
    assert torch.allclose(s.cpu(), rs, rtol=1e-5, atol=0)
    # unscrambled: x times 2^e (per token and block) times the element's decode factor
    xs = _unscramble(q, k)
    inv = s.cpu().reshape(k // 64, 2, 8)[:, 0, :]  # [groups, n]: 2^-e
    fac = torch.tensor(H.X_FACTORS[fmt])  # registers A, B, C, D
    e = torch.arange(k)
    grp, sel = (e // 64) % 2, e % 2
    f_el = torch.where(grp == 0, torch.where(sel == 0, fac[0], fac[2]), torch.where(sel == 0, fac[1], fac[3]))
    back = xs * inv.T.repeat_interleave(64, dim=1) / f_el
    assert torch.equal(back[m:], torch.zeros_like(back[m:]))  # tokens past M are zeros
    assert rel_err(back[:m], x.float()) < 1e-3
    # the largest |x| of each live (token, block) lands in [2^XHEAD, 2^(XHEAD + 1)) before the factor
    amax = (xs[:m] / f_el).abs().reshape(m, k // 128, 128).amax(2)
    live = x.float().abs().reshape(m, k // 128, 128).amax(2) > 0
    assert ((amax[live] >= 2.0 ** TK.XHEAD) & (amax[live] < 2.0 ** (TK.XHEAD + 1))).all()


@pytest.mark.parametrize("fmt", [4, 5])
@pytest.mark.parametrize("n,k", [(1, 640), (4, 384), (8, 1152), (4, 5120)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_xq_is_rmsnorm_then_xq(fmt, n, k, with_residual):
    # NINFER_KW_XREUSE: the norm before a tensor-core K-walk GEMV writes its prepared x. The
    # norm's output to the bit (residual updated alike), and XQ / XS exactly as xq leaves them for
    # that output (every token slot, the ones past n zeros)
    from ninfer.kernels.triton.norms import rmsnorm

    x, w, res_a, res_b = norm_inputs(n, k, n * 10 + k + fmt, with_residual, DEV)
    scratch = TK.xq_scratch(x.device, k)  # the tensors' own device ("cuda:0"): the kernels' scratch
    for t in scratch:
        t.fill_(-3)
    h = TK.norm_xq(x, w, 1e-6, fmt, residual=res_a)
    fused = [t.clone() for t in scratch]
    assert not torch.equal(fused[1], torch.full_like(fused[1], -3))  # the scratch the kernel wrote
    assert torch.equal(h, rmsnorm(x, w, 1e-6, residual=res_b))
    if res_a is not None:
        assert torch.equal(res_a, res_b)
    for t in scratch:
        t.fill_(-3)
    TK.xq(h, fmt, k)
    for got, want in zip(fused, scratch):
        assert torch.equal(got, want)


def test_norm_xq_refuses_what_the_gemv_does_not_take():
    w = torch.zeros(256, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="rows of a multiple of 128"):
        TK.norm_xq(torch.zeros(9, 256, dtype=torch.bfloat16, device=DEV), w, 1e-6, 4)
    with pytest.raises(ValueError, match="rows of a multiple of 128"):
        TK.norm_xq(torch.zeros(1, 256, dtype=torch.bfloat16, device=DEV), w, 1e-6, 6)


@pytest.mark.parametrize("fmt", [4, 5])
def test_xq_sums_undo_the_decode_bias(fmt):
    """Per group and token: (sum over the group of (bias + code) x stored x) x 2^-e + the stored
    -sum(bias x stored x) x 2^-e = sum of code x x (up to fp16's rounding of x)."""
    k, m = 256, 2
    g = torch.Generator().manual_seed(fmt)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    codes = torch.randint(-8, 8, (k,), generator=g).float()
    q, s = TK.xq_reference(x, fmt, k)
    xs = _unscramble(q, k)[:m]  # [m, k]: 2^e x factor x x
    st = s.reshape(k // 64, 2, 8)
    e = torch.arange(k)
    grp, sel = (e // 64) % 2, e % 2
    bias = torch.tensor([TC.bias_of(fmt, i) for i in range(4)])
    fac = torch.tensor(H.X_FACTORS[fmt])
    b_el = torch.where(grp == 0, torch.where(sel == 0, bias[0], bias[2]), torch.where(sel == 0, bias[1], bias[3]))
    f_el = torch.where(grp == 0, torch.where(sel == 0, fac[0], fac[2]), torch.where(sel == 0, fac[1], fac[3]))
    biased = b_el + codes / f_el  # what the decode leaves: bias + code / factor
    for gi in range(k // 64):
        sl = slice(64 * gi, 64 * gi + 64)
        c = (xs[:, sl].double() * biased[sl].double()).sum(1)
        got = c * st[gi, 0, :m].double() + st[gi, 1, :m].double()
        want = (x[:, sl].double() * codes[sl].double()).sum(1)
        assert torch.allclose(got, want, rtol=2e-3, atol=2e-2 * x[:, sl].float().abs().sum(1).max().item() / 64), gi


@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64"])
@pytest.mark.parametrize("m,n,k", [(1, 64, 512), (3, 100, 256), (8, 48, 1024), (5, 32, 384)])
def test_reference_path_matches_oracle(scheme, m, n, k):
    g = torch.Generator().manual_seed(m * 100 + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    cfg = TK.TKWConfig(tb=1)
    assert TK.supports(p, cfg)
    y = TK.launch(x, p, cfg)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x.float() @ deq.T) < 4e-3
    gu = (torch.randn(m, 2 * k, generator=g) * 2).to(torch.bfloat16)
    yg = TK.launch(gu, p, cfg, gated=True)
    assert rel_err(yg, TK.gated_input(gu, k).float() @ deq.T) < 4e-3


def test_configs_shares_and_refusals():
    p, _ = packed_and_ref(torch.randn(32, 384), "q4_g64")
    assert TK.supports(p, TK.TKWConfig(tb=1, splits=2))  # 3 trips: 2 + 1
    assert TK.supports(p, TK.TKWConfig(tb=3))
    assert not TK.supports(p, TK.TKWConfig(tb=2))  # 3 blocks
    assert not TK.supports(p, TK.TKWConfig(tb=1, splits=4))  # 1 + 1 + 1 + 0: a share with no trip
    assert not TK.supports(p, TK.TKWConfig(tb=1, splits=3))  # powers of two only
    assert TK.supports(p, TK.TKWConfig(tb=1, pf=4))
    assert not TK.supports(p, TK.TKWConfig(tb=1, pf=5))
    assert TK.supports(p, TK.TKWConfig(tb=1, pf=0)) and not TK.supports(p, TK.TKWConfig(tb=3, pf=0))
    with pytest.raises(ValueError, match="multiple of 256"):
        TK.launch(torch.zeros(1, 384, dtype=torch.bfloat16), p, TK.TKWConfig(tb=2))
    with pytest.raises(ValueError, match="at most 8 rows"):
        TK.launch(torch.zeros(9, 384, dtype=torch.bfloat16), p, TK.TKWConfig(tb=1))
    with pytest.raises(ValueError, match=r"\[M, 768\]"):
        TK.launch(torch.zeros(1, 384, dtype=torch.bfloat16), p, TK.TKWConfig(tb=1), gated=True)
    p6, _ = packed_and_ref(torch.randn(32, 256), "q6_g64")
    assert not TK.supports(p6, TK.TKWConfig(tb=1))
    # shares: ceil(trips / splits), the last what is left (17 trips in two: 9 + 8)
    assert TK._share(17, 2) == 9 and TK._share(34, 4) == 9
    # the default: 64 rows a CTA, shares only while the row blocks give < 2 CTAs an SM
    assert TK.default_config(4, 34816, 5120, 132) == TK.TKWConfig(2, 1, 4, 1)
    assert TK.default_config(5, 5120, 17408, 132) == TK.TKWConfig(2, 1, 4, 4)
    assert TK.default_config(5, 13312, 5120, 132) == TK.TKWConfig(2, 1, 4, 2)
    assert TK.default_config(6, 5120, 5120, 132) is None
    assert TK.workspace_need(p, TK.TKWConfig(tb=1, splits=2)) == (2 * 8 * 32, 1)
    assert TK.workspace_need(p, TK.TKWConfig(tb=1)) == (0, 0)


def test_ring_configs_fit_and_describe():
    assert TK._fits(5, 1024, TK.TKWConfig(tb=2, ring=4))  # 8 blocks
    assert TK._fits(5, 1024, TK.TKWConfig(tb=1, ring=8, splits=2))
    assert not TK._fits(5, 1024, TK.TKWConfig(tb=2, ring=1))  # a ring of one stage is no ring
    assert not TK._fits(5, 1024, TK.TKWConfig(tb=2, ring=9))
    assert TK._fits(5, 384, TK.TKWConfig(tb=3)) and not TK._fits(5, 384, TK.TKWConfig(tb=3, ring=2))  # TB a power of two
    # shared memory: stages x TB x (R rows x (64 + 4 [+ 32 for q5]) bytes + x's 2 KB + its sums), at most RING_SMEM
    assert TK.ring_bytes(4, TK.TKWConfig(tb=2, ring=4)) == 4 * 2 * (64 * 68 + 2048 + 128)
    assert TK.ring_bytes(5, TK.TKWConfig(tb=2, ring=4)) == 4 * 2 * (64 * 100 + 2048 + 128)
    # x's copies take warps over (group, jh): 2 TB x 2 >= num_warps
    assert TK._fits(4, 1024, TK.TKWConfig(tb=2, ring=3, num_warps=8)) and not TK._fits(4, 1024, TK.TKWConfig(tb=1, ring=3, num_warps=8))
    assert not TK._fits(5, 8192, TK.TKWConfig(tb=8, ring=8))  # 8 x 8 x 64 x 100 bytes
    assert TK.TKWConfig(2, ring=4).describe() == "TKW TB2 R4 w4 S1"


def test_ring_waves_of_gate_up():
    """The occupancy rule behind TUNED_TKW's gate+up ring entry: 544 CTAs of 64 rows fit 132 SMs in
    one wave at 3 stages (38.4 KB a CTA, 5 an SM) and not at 4 (51 KB, 4 an SM)."""
    assert TK.ring_waves(4, 34816, TK.TKWConfig(2, ring=3), 132) == (5, 1)
    assert TK.ring_waves(4, 34816, TK.TKWConfig(2, ring=4), 132) == (4, 2)
    assert TK.ring_waves(5, 5120, TK.TKWConfig(2, ring=4, splits=4), 132) == (3, 1)  # 320 CTAs
    assert TK.ring_waves(4, 34816, TK.TKWConfig(2, ring=3, num_warps=8), 132) == (3, 1)  # 64.5 KB: 3 an SM, 272 CTAs


@pytest.mark.parametrize("fmt,n,k", [(4, 34816, 5120), (5, 5120, 17408), (5, 16384, 5120), (5, 5120, 6144)])
def test_one_wave_rings(fmt, n, k):
    found = TK.one_wave_rings(fmt, n, k, 132)
    assert found and len(set(found)) == len(found)
    for c in found:
        assert TK._fits(fmt, k, c) and TK.ring_waves(fmt, n, c, 132)[1] == 1
    if (fmt, n) == (4, 34816):
        assert TK.TKWConfig(2, 1, 4, 1, False, 3) in found  # the measured gate+up winner


def test_ring_switch_moves_tkw_dispatch(monkeypatch):
    """NINFER_TKW_RING=N moves a dispatched tensor-core K-walk config to its ring form where it
    fits, leaves other kernels' configs alone, and refuses a value that is not a number."""
    from ninfer_plugins.quant_int import tuned

    monkeypatch.setattr(tuned, "TUNED_TKW", {(4, 34816, 5120, "m4"): (2, 1, 4, 1, True)})
    monkeypatch.delenv("NINFER_TKW", raising=False)
    before = K.pick_gemv(4, 4, 34816, 5120, 132)
    assert before == TK.TKWConfig(2, 1, 4, 1, True)
    m1 = K.pick_gemv(4, 1, 34816, 5120, 132)
    monkeypatch.setenv("NINFER_TKW_RING", "4")
    assert K.pick_gemv(4, 4, 34816, 5120, 132) == TK.TKWConfig(2, 1, 4, 1, True, ring=4)
    assert K.pick_gemv(4, 1, 34816, 5120, 132) == m1  # not a TKW config: untouched
    monkeypatch.setattr(tuned, "TUNED_TKW", {(4, 34816, 5120, "m4"): (2, 1, 4, 1, True, 3)})
    monkeypatch.setenv("NINFER_TKW_RING", "0")  # a ring entry back to its (pinned) register form
    assert K.pick_gemv(4, 4, 34816, 5120, 132) == TK.TKWConfig(2, 1, 4, 1, True)
    monkeypatch.setenv("NINFER_TKW_RING", "four")
    with pytest.raises(ValueError, match="NINFER_TKW_RING"):
        K.pick_gemv(4, 4, 34816, 5120, 132)


def test_try_switch_puts_candidates_first(monkeypatch):
    """NINFER_TKW_TRY=1 dispatches TUNED_TKW_TRY's candidates ahead of TUNED_TKW (and of the
    kernels a () entry leaves in place); without it they are never picked; the load-time
    reservation counts them either way."""
    from ninfer_plugins.quant_int import tuned

    monkeypatch.delenv("NINFER_TKW", raising=False)
    monkeypatch.delenv("NINFER_TKW_TRY", raising=False)
    monkeypatch.setattr(tuned, "TUNED_TKW", {(4, 131072, 5120, "m1"): ()})
    monkeypatch.setattr(tuned, "TUNED_TKW_TRY", {(4, 131072, 5120, "m1"): (2, 1, 4, 1, False, 4)})
    before = K.pick_gemv(4, 1, 131072, 5120, 132)
    assert not isinstance(before, TK.TKWConfig)
    monkeypatch.setenv("NINFER_TKW_TRY", "1")
    assert K.pick_gemv(4, 1, 131072, 5120, 132) == TK.TKWConfig(2, 1, 4, 1, False, 4)
    assert K.pick_gemv(4, 4, 131072, 5120, 132) == K.pick_gemv(4, 4, 131072, 5120, 132)  # other buckets as before
    monkeypatch.setenv("NINFER_TKW_TRY", "0")
    assert K.pick_gemv(4, 1, 131072, 5120, 132) == before


def test_dispatch_switch(monkeypatch):
    """NINFER_TKW=1 sends every q4/q5 M <= 8 launch it fits to this kernel (its tuned winner, else
    the default); NINFER_TKW=0 keeps even the tuned winners out; q6/q8 never take it."""
    if not TC.HAVE_GLUON:
        pytest.skip("Gluon missing")
    monkeypatch.setenv("NINFER_TKW", "1")
    from ninfer_plugins.quant_int.tuned import TUNED_TKW

    for m in (1, 4, 8):
        got = K.pick_gemv(5, m, 5120, 17408, 132)
        want = TUNED_TKW.get((5, 5120, 17408, "m1" if m == 1 else "m4" if m <= 4 else "m8"))
        assert got == (TK.TKWConfig(*want) if want else TK.default_config(5, 5120, 17408, 132))
    assert not isinstance(K.pick_gemv(6, 1, 5120, 17408, 132), TK.TKWConfig)
    assert not isinstance(K.pick_gemv(8, 4, 2048, 4096, 132), TK.TKWConfig)
    monkeypatch.setenv("NINFER_TKW", "0")
    for m in (1, 4, 8):
        assert not isinstance(K.pick_gemv(5, m, 5120, 17408, 132), TK.TKWConfig)
    monkeypatch.delenv("NINFER_TKW")
    for (fmt, n, k, bucket), cfg in TUNED_TKW.items():
        m = {"m1": 1, "m4": 4, "m8": 8}[bucket]
        got = K.pick_gemv(fmt, m, n, k, 132)
        assert got == TK.TKWConfig(*cfg) if cfg else not isinstance(got, TK.TKWConfig)


# --- on the GPU ---------------------------------------------------------------------------------

SHAPES = {
    "q4_g64": [(34816, 5120), (17408, 5120), (1024, 5120), (1000, 512), (256, 1408)],
    "q5_g64": [(5120, 17408), (16384, 5120), (5120, 6144), (13312, 5120), (200, 1024), (128, 1408)],
}
# incl. ragged shares with one and two blocks ahead (1,408 = 11 blocks; 17,408 = 68 blocks in 8 = 7 x 9 + 5)
CONFIGS = [TK.TKWConfig(), TK.TKWConfig(2, 2, 4, 1), TK.TKWConfig(1, 1, 2, 2), TK.TKWConfig(4, 1, 4, 2),
           TK.TKWConfig(1, 2, 1, 4), TK.TKWConfig(2, 1, 8, 1), TK.TKWConfig(2, 1, 4, 8), TK.TKWConfig(2, 2, 4, 8),
           TK.TKWConfig(1, 2, 4, 2), TK.TKWConfig(4, 4, 4, 1), TK.TKWConfig(4, 3, 2, 2), TK.TKWConfig(1, 4, 4, 4),
           # ping-pong trips (pf 0), an odd trip count per share among them (K = 1408 at TB 1: 11 trips)
           TK.TKWConfig(4, 0, 4, 1), TK.TKWConfig(2, 0, 4, 4), TK.TKWConfig(1, 0, 2, 2),
           # the blocks ahead pinned
           TK.TKWConfig(4, 4, 4, 1, True), TK.TKWConfig(2, 1, 4, 4, True),
           # the cp.async ring: ragged shares, a share shorter than the ring (K = 1408 at TB 2 in 4: 2 trips or
           # fewer a share against 3 in flight), one trip a stage, 2 and 8 warps
           TK.TKWConfig(2, ring=4), TK.TKWConfig(1, ring=6, splits=2), TK.TKWConfig(2, ring=3, splits=4),
           TK.TKWConfig(1, ring=2, num_warps=2, splits=8), TK.TKWConfig(2, ring=3, num_warps=8)]
_PACKED: dict = {}


def _packed(scheme: str, n: int, k: int):
    """(prepared, dequantized) per shape, made once a test session (quantizing 34816 x 5120 is slow)."""
    key = (scheme, n, k)
    if key not in _PACKED:
        g = torch.Generator(device="cuda").manual_seed(n + k)
        _PACKED[key] = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g), scheme)
    return _PACKED[key]


def _fitting(scheme: str, cfg):
    """(n, k, prepared, dequantized) of each of SHAPES[scheme] the config takes, its workspace reserved."""
    for n, k in SHAPES[scheme]:
        p, deq = _packed(scheme, n, k)
        if TK.supports(p, cfg):
            K.Workspace.get(p.device).reserve(*cfg.workspace(p))
            yield n, k, p, deq


def _tokens(m: int, k: int) -> torch.Tensor:
    """m rows of x, every token its own magnitude (a wrong token's scale or sum shows in its row)."""
    return torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * (4.0 ** torch.arange(m, device="cuda"))[:, None].bfloat16()


def _row_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst row's relative error (rows of zeros in ref skipped): a wrong token's scale shows."""
    return max((rel_err(y[i], ref[i]) for i in range(ref.shape[0]) if ref[i].abs().max() > 0), default=0.0)


@gpu
@needs_gpu
@pytest.mark.parametrize("fmt", [4, 5])
@pytest.mark.parametrize("m,k", [(1, 5120), (4, 17408), (8, 1408)])
def test_gpu_xq_kernel_matches_reference(fmt, m, k):
    torch.manual_seed(m + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * (4.0 ** torch.arange(m, device="cuda"))[:, None].bfloat16()
    q, s = TK.xq(x, fmt, k)
    rq, rs = TK.xq_reference(x.cpu(), fmt, k)
    assert torch.equal(q.cpu(), rq)
    # the group sums add 64 terms of ~1e7 with cancellation: the order of the sum shows at ~1e-6
    assert torch.allclose(s.cpu(), rs, rtol=1e-5, atol=0)


@gpu
@needs_gpu
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.describe().replace(" ", "_"))
def test_gpu_tkw_every_shape_class(scheme, cfg):
    torch.manual_seed(0)
    for n, k, p, deq in _fitting(scheme, cfg):
        for m in (1, 2, 3, 4, 5, 8):
            x = _tokens(m, k)
            if m == 3:
                x[1] = 0  # a zero row next to live ones
                x[2] *= 1000  # a large-valued row (fp16 would overflow without the scaling)
            y = TK.launch(x, p, cfg)
            err = _row_err(y, x.float() @ deq.float().T)
            assert err < 6e-3, (scheme, n, k, m, cfg, err)
            # the kernel's arithmetic, in fp32 (x as fp32 keeps the reference's output unrounded)
            assert _row_err(y, TK.reference(x.float(), p, deq.float())) < 4e-3, (scheme, n, k, m, cfg)
            if m == 3:
                assert torch.count_nonzero(y[1]) == 0
        gu = torch.randn(4, 2 * k, device="cuda", dtype=torch.bfloat16)
        yg = TK.launch(gu, p, cfg, gated=True)
        assert _row_err(yg, TK.gated_input(gu, k).float() @ deq.float().T) < 6e-3, (scheme, n, k, cfg)


@gpu
@needs_gpu
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64"])
@pytest.mark.parametrize("cfg", [TK.TKWConfig(2, ring=3), TK.TKWConfig(1, ring=6, splits=2), TK.TKWConfig(2, ring=4, splits=4),
                                 TK.TKWConfig(2, ring=3, num_warps=8)], ids=lambda c: c.describe().replace(" ", "_"))
def test_gpu_tkw_ring_sums_in_ring(scheme, cfg, monkeypatch):
    """NINFER_TKW_XS=1 (x's scalings and bias sums through the ring too): the outputs of the ring
    reading them from memory (the same arithmetic in the same order: equal up to how ptxas fuses
    the two FMAs; a wrong offset would be a wrong group's scale, errors of order 1)."""
    torch.manual_seed(3)
    for n, k, p, deq in _fitting(scheme, cfg):
        for m in (1, 3, 4, 8):
            x = _tokens(m, k)
            monkeypatch.delenv("NINFER_TKW_XS", raising=False)
            want = TK.launch(x, p, cfg)
            monkeypatch.setenv("NINFER_TKW_XS", "1")
            got = TK.launch(x, p, cfg)
            assert _row_err(got, want) < 1e-3, (scheme, n, k, m, cfg)
            assert _row_err(got, x.float() @ deq.float().T) < 6e-3


@gpu
@needs_gpu
@pytest.mark.parametrize("pdl", ["0", "1"])
def test_gpu_tkw_graph_replay_bit_equal_to_eager(pdl, monkeypatch):
    """Replays of a CUDA graph bit-equal to the eager launch (the shares' sum is in a fixed order),
    and a launch after a kernel that wrote x reads the new x (PDL: x is read after the wait)."""
    monkeypatch.setenv("NINFER_PDL", pdl)
    torch.manual_seed(7)
    for scheme, n, k, cfg in (("q5_g64", 5120, 17408, TK.TKWConfig(2, 1, 4, 4)), ("q4_g64", 34816, 5120, TK.TKWConfig()),
                              ("q5_g64", 5120, 17408, TK.TKWConfig(2, splits=4, ring=4)),
                              ("q4_g64", 34816, 5120, TK.TKWConfig(2, ring=4))):
        p, deq = _packed(scheme, n, k)
        K.Workspace.get(p.device).reserve(*cfg.workspace(p))
        TK.xq_scratch(p.device, k)
        x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
        first = TK.launch(x, p, cfg)
        src = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)

        def step():
            x.copy_(src)  # the kernel before it writes x
            return TK.launch(x, p, cfg)

        for y in replayed(step, 3):
            assert torch.equal(y, TK.launch(src, p, cfg))
        assert rel_err(first, src.float() @ deq.float().T) > 0.1
        assert _row_err(y, src.float() @ deq.float().T) < 6e-3


@gpu
@needs_gpu
def test_gpu_dispatched_tkw_configs_in_a_graph(monkeypatch):
    """With NINFER_TKW=1, the 27B's q4/q5 projections through kernels.launch as the engine calls
    it (workspace reserved at load, CUDA graph) at M = 1, 4, 8, the kernel picked being this one."""
    from test_gemv_h2 import dispatched_in_a_graph

    monkeypatch.setenv("NINFER_TKW", "1")
    table = {(4, 34816, 5120, "m1"): (1,), (5, 5120, 17408, "m1"): (1,), (5, 13312, 5120, "m1"): (1,)}
    for fmt, n, k, _ in table:
        for m in (1, 4, 8):
            assert isinstance(K.pick_gemv(fmt, m, n, k, 132), TK.TKWConfig), (fmt, n, k, m)
    dispatched_in_a_graph(table, (1, 4, 8))


@gpu
@needs_gpu
@pytest.mark.parametrize("scheme,n,k", [("q4_g64", 1000, 512), ("q5_g64", 16384, 5120)])
def test_gpu_tkw_takes_x_prepared_by_the_norm(scheme, n, k, monkeypatch):
    """NINFER_KW_XREUSE=1: the GEMV on norm_xq's output launches no xq of its own and gives the
    bits of the GEMV that prepares x itself, eager and replayed in a graph; an x changed in place
    is prepared again."""
    p, _ = _packed(scheme, n, k)
    cfg = TK.TKWConfig()
    K.Workspace.get(p.device).reserve(*cfg.workspace(p))
    torch.manual_seed(5)
    x = _tokens(4, k)
    w = torch.randn(k, device="cuda", dtype=torch.bfloat16) * 0.1
    res = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
    h_plain = TK.norm_xq(x, w, 1e-6, p.fmt, residual=res.clone())
    want = TK.launch(h_plain, p, cfg)
    monkeypatch.setenv("NINFER_KW_XREUSE", "1")
    made = count_launches(monkeypatch, TK, "_xq_kernel")

    def step():
        h = TK.norm_xq(x, w, 1e-6, p.fmt, residual=res.clone())
        return TK.launch(h, p, cfg), h

    got, h = step()
    assert made == [] and torch.equal(h, h_plain) and torch.equal(got, want)
    h.mul_(2)  # changed in place before anything else notes: prepared again
    again = TK.launch(h, p, cfg)
    assert len(made) == 1
    for y, _ in replayed(step):
        assert torch.equal(y, want)
    monkeypatch.setenv("NINFER_KW_XREUSE", "0")
    monkeypatch.setenv("NINFER_NORM_PAIRS", "0")  # on by default: it keeps the notes too
    assert torch.equal(again, TK.launch(h, p, cfg))
