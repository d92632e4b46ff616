"""The tensor-core decode GEMV (quant_int/gemv_tc.py, Gluon) against dequantize-then-matmul.

CPU (CI): the per-word decode PTX in test_ptx_decode's emulator over random words (every output
lane equals its bias plus factor x code, exactly); the logical-k relabelling is a bijection whose
x side and weight side agree; the torch `reference` (the CPU path) against the fp32 oracle.
GPU (`-m gpu`): every 27B/35B q4/q5 shape class at M = 1..8 and several configs, K and row
tails, a zero activation row, CUDA-graph replay with bit-equal repeats.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # as the other quant_int tests: Triton must see this before its import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ninfer_plugins.quant_int import gemv_h2 as H  # noqa: E402
from ninfer_plugins.quant_int import gemv_tc as TC  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from test_gemv_h2 import _code, dispatched_in_a_graph, packed_and_ref, rel_err  # noqa: E402  (same folder)
from test_ptx_decode import f16_value, run_ptx  # noqa: E402  (same folder: pytest puts it on sys.path)

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (CUDA and TC.HAVE_GLUON), reason="needs a GPU and Triton's Gluon")


@pytest.mark.parametrize("fmt", [4, 5])
def test_word_asm_biased_values_exact(fmt):
    """Outputs $0..$3 = pa, pc, pb, pd: lane (half) h of pa is element 2h of the word's four (low
    nibbles, group 2kb), pc element 2h + 1; pb/pd the same elements' high-nibble codes. Each
    lane reads bias + factor x code, with bias_of and X_FACTORS' reciprocal."""
    asm, constr = TC.word_asm(fmt)
    n_inputs = constr.count("r") - constr.count("=r")
    assert n_inputs == 8 * (3 if fmt == 5 else 1)
    g = torch.Generator().manual_seed(fmt)
    for trial in range(64):
        word = int(torch.randint(0, 1 << 32, (1,), generator=g, dtype=torch.int64))
        ops = {4 + i: word for i in range(8)}
        if fmt == 5:
            j = trial % 4
            sh = 16 * ((trial // 4) % 2)
            hl_raw, hh_raw = (int(v) for v in torch.randint(0, 1 << 32, (2,), generator=g, dtype=torch.int64))
            hl, hh = (hl_raw >> sh) & 0xFFFF, (hh_raw >> sh) & 0xFFFF
            sa, sb = hl | (hl << 14), hh | (hh << 14)
            # the kernel's ul / uh for word j of its run
            ul = (sa << 4) & 0xFFFFFFFF if j == 0 else sa >> (4 * j - 4)
            uh = (sb << (8 - 4 * j)) & 0xFFFFFFFF if j < 2 else sb >> (4 * j - 8)
            ops.update({12 + i: ul for i in range(8)})
            ops.update({20 + i: uh for i in range(8)})
        regs = run_ptx(asm, ops)
        for out, (reg_i, sel, grp) in enumerate(((0, 0, 0), (2, 1, 0), (1, 0, 1), (3, 1, 1))):
            v = regs[f"${out}"]
            for half in range(2):
                byte_i = 2 * half + sel
                byte = (word >> (8 * byte_i)) & 0xFF
                u = (byte >> 4) if grp else (byte & 0xF)
                if fmt == 5:
                    e = 4 * j + byte_i
                    u |= (((hh if grp else hl) >> e) & 1) << 4
                factor = 1.0 / H.X_FACTORS[fmt][reg_i]
                want = TC.bias_of(fmt, reg_i) + factor * _code(u, fmt)
                got = f16_value((v >> (16 * half)) & 0xFFFF)
                assert got == want, (fmt, trial, out, half, got, want)


def test_logical_k_is_a_bijection_and_matches_the_x_side():
    k = torch.arange(128)
    el = TC.logical_to_element(k)
    assert sorted(el.tolist()) == list(range(128))
    # the x writer's formula: k = half + 2 t + 8 sel + 16 grp + 32 j
    half, t, sel, grp, j = k % 2, (k // 2) % 4, (k // 8) % 2, (k // 16) % 2, k // 32
    assert torch.equal(el, 64 * grp + 16 * t + 4 * j + 2 * half + sel)


@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64"])
@pytest.mark.parametrize("m,n,k,kb", [(1, 64, 512, 4), (3, 100, 256, 2), (8, 48, 1024, 8), (5, 32, 384, 1)])
def test_reference_path_matches_oracle(scheme, m, n, k, kb):
    g = torch.Generator().manual_seed(m * 100 + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    cfg = TC.TCConfig(kb=kb)
    assert TC.supports(p, cfg)
    y = TC.launch(x, p, cfg)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x.float() @ deq.T) < 4e-3


@pytest.mark.parametrize("num_warps", [1, 2, 4, 8])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
def test_last_cta_sum_fills_its_layout_exactly(num_warps, tokens):
    """`_sum_slices` loads [SC, tokens x RED] tiles in LRED (4 x 32 x warps columns): fewer columns
    would replicate every thread's values across threads (the 168-register peak at down's 17
    slices), more would repeat them in registers. RED is a power of two, and the per-thread
    load stays at SUM_SC x 4 values whatever the slice count."""
    red = TC.red_rows(num_warps, tokens)
    assert red * tokens == 4 * 32 * num_warps
    assert red & (red - 1) == 0
    assert TC.SUM_SC * 4 <= 32


def test_refuses_what_it_cannot_run():
    p, _ = packed_and_ref(torch.randn(32, 384), "q4_g64")
    assert not TC.supports(p, TC.TCConfig(kb=2))  # 3 K blocks
    with pytest.raises(ValueError, match="K % 256"):
        TC.launch(torch.zeros(1, 384, dtype=torch.bfloat16), p, TC.TCConfig(kb=2))
    with pytest.raises(ValueError, match="at most 8 rows"):
        TC.launch(torch.zeros(9, 384, dtype=torch.bfloat16), p, TC.TCConfig(kb=1))
    p6, _ = packed_and_ref(torch.randn(32, 256), "q6_g64")
    assert not TC.supports(p6, TC.TCConfig(kb=2))


# --- on the GPU ---------------------------------------------------------------------------------

SHAPES = {
    "q4_g64": [(17408, 5120), (34816, 5120), (1024, 5120), (1000, 512)],
    "q5_g64": [(5120, 17408), (16384, 5120), (5120, 6144), (6144, 5120), (13312, 5120), (200, 1024)],
}
CONFIGS = [TC.TCConfig(), TC.TCConfig(kb=8, stages=3, num_warps=4, ctas=2), TC.TCConfig(kb=1, stages=4),
           # the direct kernel: two blocks ahead, one ahead, one block a slice (the prologue's
           # other branch), 8 warps
           TC.TCConfig(4, 0, 4, 6, 2), TC.TCConfig(8, 0, 4, 4, 1), TC.TCConfig(1, 0, 4, 6, 2),
           TC.TCConfig(2, 0, 8, 3, 1)]


@gpu
@needs_gpu
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.describe().replace(" ", "_"))
def test_gpu_tc_every_shape_class(scheme, cfg):
    torch.manual_seed(0)
    for n, k in SHAPES[scheme]:
        p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
        if not TC.supports(p, cfg):
            continue
        K.Workspace.get(p.device).reserve(*cfg.workspace(p))
        for m in (1, 2, 3, 4, 5, 8):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            if m == 3:
                x[1] = 0  # a zero row next to live ones
                x[2] *= 1000  # a large-valued row (fp16 would overflow without the scaling)
            ref = x.float() @ deq.T
            y = TC.launch(x, p, cfg)
            err = rel_err(y, ref)
            assert err < 4e-3, (scheme, n, k, m, cfg, err)
            if m == 3:
                assert torch.count_nonzero(y[1]) == 0


@gpu
@needs_gpu
def test_gpu_tc_graph_replay_and_bit_equal_repeats():
    torch.manual_seed(1)
    p, deq = packed_and_ref(torch.randn(5120, 17408, device="cuda", dtype=torch.bfloat16), "q5_g64")
    cfg = TC.TCConfig()
    K.Workspace.get(p.device).reserve(*cfg.workspace(p))
    x = torch.randn(4, 17408, device="cuda", dtype=torch.bfloat16)
    first = TC.launch(x, p, cfg)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = TC.launch(x, p, cfg)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, first)
    assert rel_err(first, x.float() @ deq.T) < 4e-3


@gpu
@needs_gpu
@pytest.mark.parametrize("pdl,late", [("0", "0"), ("1", "0"), ("1", "1")])
def test_gpu_tc_direct_graph_replay_bit_equal_to_eager(pdl, late, monkeypatch):
    """The direct kernel (weights straight into registers) with and without its programmatic
    dependent launch prologue (and with its late trigger, the default; NINFER_TC_LATE=0 is the early one): a CUDA graph's
    replays bit-equal to the eager launch, and a launch after another kernel that wrote x reads
    the new x."""
    monkeypatch.setenv("NINFER_PDL", pdl)
    monkeypatch.setenv("NINFER_TC_LATE", late)
    torch.manual_seed(7)
    for scheme, n, k in (("q5_g64", 5120, 17408), ("q4_g64", 34816, 5120)):
        p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
        cfg = TC.direct_default(p.fmt, n, k)
        K.Workspace.get(p.device).reserve(*cfg.workspace(p))
        x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
        first = TC.launch(x, p, cfg)
        src = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x.copy_(src)  # the kernel before it writes x
            y = TC.launch(x, p, cfg)
        for _ in range(3):
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, TC.launch(src, p, cfg))
        assert rel_err(first, x.float() @ deq.T) > 0.1  # x changed: the graph's output is not the first one
        assert rel_err(y, src.float() @ deq.T) < 4e-3


def test_direct_default_and_the_switch(monkeypatch):
    """direct_default: 8 K blocks a slice on long K, 4 elsewhere; q4/q5 only. NINFER_TCD=1 makes
    the dispatch take it for every q4/q5 launch of M <= 8 (the A/B switch); off by default."""
    monkeypatch.setenv("NINFER_KW", "0")  # the dispatch without the K-walks (tuned.TUNED_KW, TUNED_TKW off)
    monkeypatch.setenv("NINFER_TKW", "0")
    assert TC.direct_default(5, 5120, 17408) == TC.TCConfig(8, 0, 4, 6, 2)
    assert TC.direct_default(4, 34816, 5120) == TC.TCConfig(4, 0, 4, 6, 2)
    assert TC.direct_default(4, 1000, 384) is None  # 3 K blocks
    p, _ = packed_and_ref(torch.randn(32, 512), "q4_g64")
    assert not TC.supports(p, TC.TCConfig(4, 0, 4, 6, 3))  # one or two blocks ahead only
    if not TC.enabled():
        pytest.skip("Gluon missing")
    monkeypatch.setenv("NINFER_TCD", "1")
    assert K.pick_gemv(5, 4, 5120, 17408, 132) == TC.TCConfig(8, 0, 4, 6, 2)
    assert K.pick_gemv(5, 4, 13312, 5120, 132) == TC.TCConfig(8, 0, 4, 4, 2)  # its tuned winner
    assert K.pick_gemv(5, 1, 13312, 5120, 132) == TC.TCConfig(4, 0, 4, 6, 2)  # the default (M = 1 untuned)
    assert not isinstance(K.pick_gemv(6, 1, 5120, 17408, 132), TC.TCConfig)
    monkeypatch.delenv("NINFER_TCD")
    from ninfer_plugins.quant_int.tuned import TUNED_TC

    for fmt, n, k in ((5, 5120, 6144), (5, 5120, 17408), (4, 34816, 5120)):
        got = K.pick_gemv(fmt, 1, n, k, 132)
        want = TUNED_TC.get((fmt, n, k, "m1"))
        assert got == TC.TCConfig(*want) if want else not isinstance(got, TC.TCConfig)


@gpu
@needs_gpu
def test_gpu_dispatched_tc_configs_in_a_graph():
    """Every shape of tuned.TUNED_TC through kernels.launch as the engine calls it: workspace
    reserved at load (a fresh one), then M = 1..8 captured in a CUDA graph against the fp32
    reference (M = 2..8 take the tensor-core GEMV where TUNED_TC names a winner)."""
    from ninfer_plugins.quant_int.tuned import TUNED_TC

    dispatched_in_a_graph(TUNED_TC, (1, 2, 4, 6, 8))


def test_dispatch_picks_tc_where_tuned(monkeypatch):
    from ninfer_plugins.quant_int.tuned import TUNED_TC

    monkeypatch.delenv("NINFER_TCD", raising=False)
    monkeypatch.setenv("NINFER_KW", "0")  # the dispatch without the K-walks (tuned.TUNED_KW, TUNED_TKW off)
    monkeypatch.setenv("NINFER_TKW", "0")
    monkeypatch.delenv("NINFER_TC", raising=False)
    if not TC.enabled():
        pytest.skip("Gluon missing")
    for (fmt, n, k, bucket), cfg in TUNED_TC.items():
        m = {"m1": 1, "m4": 4, "m8": 8}[bucket]
        got = K.pick_gemv(fmt, m, n, k, 132)
        if cfg:
            assert got == TC.TCConfig(*cfg)
        else:
            assert not isinstance(got, TC.TCConfig)
