"""The pair kernels of decode (pair_gemv.py: one split-K GEMV per (token, expert) pair, the
shared expert as one more pair, silu * up and the routing-weighted combine fused) against the
fp32 oracle of the decoded weights.

CPU (CI): interpreted, E 8, H 256, I 128, top 3, T = 1..4, routings that pick experts 0 and E-1
and repeat a token's choice (two pairs reading one expert); every int format on either side.
GPU (`-m gpu`): the real shapes (256 experts, H 2048, I 512, top 8) of the int4 and int8
recipes, T = 1..4, bit-reproducible, and replayed in a CUDA graph over changing routings.
"""

from __future__ import annotations

import pytest
import torch
import triton
from moe_cases import ACT, DEV, captured, expert_bank, logits_hitting, shared_expert

from ninfer.kernels import reference as R
from ninfer.kernels.triton.launch import interpreting
from ninfer_plugins.moe_triton import pair_gemv as PG
from ninfer_plugins.moe_triton.grouped_gemv import experts_reference
from ninfer_plugins.moe_triton.moe import TritonMoe
from ninfer_plugins.moe_triton.router import route
from ninfer_plugins.quant_int import kernels as QK

CUDA = torch.cuda.is_available()
interp = pytest.mark.skipif(not interpreting(), reason="interpreter tests run where there is no GPU (CI)")
needs_cuda = pytest.mark.skipif(not CUDA or interpreting(), reason="needs a CUDA device")
ATOL, RTOL = R.TOLERANCES["bf16_reduction"]


def _close(out, ref):
    assert bool(torch.isfinite(out).all())
    err = (out.double() - ref.double()).abs()
    normwise = float(err.norm() / ref.double().norm())
    worst = float((err / (ATOL + RTOL * ref.double().abs())).max())
    assert normwise <= RTOL and worst <= R.GROSS_CAP, (normwise, worst)


def _run(bank, shared, T, top_k, seed, moe=None, logits=None):
    (w, gu, dn), (sw, sdec, sg) = bank, shared
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(T, w.hidden, generator=g, device=DEV).to(torch.bfloat16).to(ACT)
    moe = moe or TritonMoe(fused_dtypes=(ACT,))
    assert moe.takes_pairs(T, w, sw)
    if logits is None:
        logits = logits_hitting(T, w.num_experts, seed=seed)
    r = route(logits, top_k, x=x, shared_gate_weight=sg)
    out = moe.run(x, r, w, sw)
    ref = experts_reference(x, r.ids[:, :top_k].long(), r.weights[:, :top_k], gu, dn, sdec, r.weights[:, top_k])
    return out, ref


CPU_CASES = [("q4_g64", "q5_g64", "q8_g32"), ("q4_g64", "q6_g64", "q8_g32"), ("q8_g32", "q8_g32", "q4_g64"),
             ("q5_g64", "q4_g64", "q6_g64")]


@interp
@pytest.mark.parametrize("gu,dn,sh", CPU_CASES)
@pytest.mark.parametrize("T", [1, 3])
def test_interpreted_pairs_equal_the_oracle(gu, dn, sh, T):
    bank = expert_bank(8, 256, 128, gu, dn, seed=T)
    shared = shared_expert(256, 128, sh, seed=T + 1)
    out, ref = _run(bank, shared, T, 3, seed=T)
    assert out.dtype == ACT and out.shape == (T, 256)
    _close(out, ref)
    again, _ = _run(bank, shared, T, 3, seed=T)
    assert torch.equal(out, again)  # fixed summation order, counters reset by the last CTA


@interp
@pytest.mark.parametrize("gu,dn,sh", CPU_CASES[:2] + [("nvfp4", "nvfp4", "q8_g32")])
@pytest.mark.parametrize("T", [1, 3])
def test_interpreted_early_pairs_equal_the_default_order(gu, dn, sh, T, monkeypatch):
    """NINFER_MOE_EARLY=1: down's weight tiles are requested before x is prepared (and, on a GPU
    under PDL, before its wait): the same arithmetic, so the same bits, as the default order."""
    bank = expert_bank(8, 256, 128, gu, dn, seed=T + 3)
    shared = shared_expert(256, 128, sh, seed=T + 4)
    monkeypatch.setenv("NINFER_MOE_EARLY", "0")
    plain, ref = _run(bank, shared, T, 3, seed=T)
    monkeypatch.setenv("NINFER_MOE_EARLY", "1")
    assert PG.early()
    # the split-K scratch still holds every pair's partials from the run before: poisoned, so a
    # pair the second run skipped cannot pass for one it ran
    QK.Workspace.get(plain.device).partials.fill_(float("nan"))
    early, _ = _run(bank, shared, T, 3, seed=T)
    _close(early, ref)
    assert torch.equal(early, plain)


@interp
@pytest.mark.parametrize("gu,dn,sh", CPU_CASES[:2])
@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_interpreted_down_combines_every_token_at_once(gu, dn, sh, T, monkeypatch):
    """down's last CTA a chunk combines all T tokens in one [TP, slot x slice, rows] load (the
    default at int formats) or a token at a time (NINFER_MOE_COMBINE_LOOP=1): both the oracle's
    output, and each other's up to the order of one sum (T = 3: the fourth token row masked)."""
    bank = expert_bank(8, 256, 128, gu, dn, seed=T + 5)
    shared = shared_expert(256, 128, sh, seed=T + 6)
    assert PG.combine_width(T, 4, 8) == (triton.next_power_of_2(T) if T > 1 else 0)
    at_once, ref = _run(bank, shared, T, 3, seed=T)
    monkeypatch.setenv("NINFER_MOE_COMBINE_LOOP", "1")
    assert PG.combine_width(T, 4, 8) == 0
    looped, _ = _run(bank, shared, T, 3, seed=T)
    _close(at_once, ref)
    _close(looped, ref)
    torch.testing.assert_close(at_once.float(), looped.float(), atol=1e-2, rtol=1e-2)


def test_combine_width_falls_back_to_the_loop():
    assert PG.combine_width(5, 4, 8) == 0  # past PAIR_MAX
    assert PG.combine_width(2, 16, 8) == 0 and PG.combine_width(2, 4, 16) == 0  # NVFP4's row scales
    assert PG.combine_width(4, 6, 8) == 0  # q6: the launch's registers
    assert PG.combine_width(3, 4, 8) == 4 and PG.combine_width(2, 5, 8) == 2
    assert PG.combine_width(1, 4, 8) == 0  # one token: the loop's single trip


@interp
@pytest.mark.parametrize("gu,dn,sh", [("nvfp4", "nvfp4", "nvfp4"), ("nvfp4", "nvfp4", "q8_g32"), ("q4_g64", "q5_g64", "nvfp4")])
def test_interpreted_nvfp4_pairs_equal_the_oracle(gu, dn, sh):
    # NVFP4 through gemv_h2's decode of it (a global scale per expert row)
    bank = expert_bank(8, 256, 128, gu, dn, seed=7)
    shared = shared_expert(256, 128, sh, seed=8)
    assert TritonMoe(fused_dtypes=(ACT,)).takes_pairs(2, bank[0], shared[0])
    out, ref = _run(bank, shared, 2, 3, seed=2)
    _close(out, ref)


@interp
@pytest.mark.parametrize("gu,sh", [("q4_g64", "q8_g32"), ("q5_g64", "q6_g64")])
def test_interpreted_gate_up_in_one_slice_needs_no_counter(gu, sh):
    """gate_up with one K slice (KBS = H / 128) finishes each chunk in its only CTA, no counter:
    with the counters poisoned it still gives h as the two-slice split (KBS = 1) does, up to
    the order of one sum, and leaves the counters as it found them."""
    T = 2
    (w, _, _), (sw, _, sg) = expert_bank(8, 256, 128, gu, "q5_g64", seed=11), shared_expert(256, 128, sh, seed=12)
    g = torch.Generator(device=DEV).manual_seed(5)
    x = torch.randn(T, 256, generator=g, device=DEV).to(torch.bfloat16)
    r = route(logits_hitting(T, 8, seed=5), 3, x=x, shared_gate_weight=sg)
    split = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, 128, 8, PG.PairConfig(32, 1, 32, 2))
    one = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, 128, 8, PG.PairConfig(16, 2, 16, 2))
    torch.testing.assert_close(one.float(), split.float(), atol=2e-2, rtol=2e-2)
    ws = QK.Workspace.get(x.device)  # sized by the call above
    ws.counters.fill_(7)
    again = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, 128, 8, PG.PairConfig(16, 2, 16, 2))
    assert bool((ws.counters == 7).all())
    ws.counters.zero_()
    assert torch.equal(one, again)


@interp
@pytest.mark.parametrize("cfg", [PG.PairConfig(16, 1, 16, 2), PG.PairConfig(8, 1, 8, 1)], ids=lambda c: c.describe())
def test_interpreted_down_in_small_chunks_equals_the_oracle(cfg, monkeypatch):
    """down with fewer rows a chunk than a trip of the default (16 and 8 rows: more CTAs), given
    directly and through NINFER_PAIR_DOWN: the oracle's output."""
    bank = expert_bank(8, 256, 128, "q4_g64", "q5_g64", seed=13)
    shared = shared_expert(256, 128, "q8_g32", seed=14)
    (w, _, _), (sw, _, _) = bank, shared
    monkeypatch.setenv("NINFER_PAIR_DOWN", f"{cfg.block_n}:{cfg.kbs}:{cfg.rows}:{cfg.num_warps}")
    assert PG.configs_for(256, 128)[1] == cfg
    for T in (1, 3):
        out, ref = _run(bank, shared, T, 3, seed=T + 13)
        _close(out, ref)
    with pytest.raises(ValueError, match="block_n:kbs:rows:warps"):
        monkeypatch.setenv("NINFER_PAIR_DOWN", "16:4")
        PG.configs_for(256, 128)
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    ids = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="does not tile"):  # K 128 has no slice of 4 blocks
        PG.down(torch.zeros(4, 128, dtype=torch.bfloat16), ids, torch.zeros(1, 4), w.down, sw.down, 256, 8,
                torch.bfloat16, PG.PairConfig(16, 4, 16, 2))
    with pytest.raises(ValueError, match="does not tile"):  # a chunk of 8 rows, trips of 16
        PG.gate_up(x, ids, w.gate_up, sw.gate, sw.up, 128, 8, PG.PairConfig(16, 2, 8, 2))


@interp
def test_interpreted_pair_configs_and_fallbacks():
    assert PG.configs_for(2048, 512) == (PG.GATE_UP, PG.DOWN)
    assert PG.configs_for(2048, 512, 4) == (PG.GATE_UP, PG.DOWN)
    assert PG.configs_for(2048, 512, 1) == (PG.GATE_UP1 or PG.GATE_UP, PG.DOWN1 or PG.DOWN)
    assert PG.GATE_UP.kbs * 128 == 2048  # the 35B's gate_up in one K slice (DIRECT)
    gu, dn = PG.configs_for(256, 128)  # one slice of the whole of K for both
    assert (gu.kbs, gu.rows, dn.kbs, dn.rows) == (2, PG.GATE_UP.rows, 1, PG.DOWN.rows)
    gu, _ = PG.configs_for(3072, 512)  # 24 blocks: no one slice within 16, the largest that tiles
    assert gu.kbs == 8
    assert PG.configs_for(136, 40) is None  # K not a multiple of 128: the tile kernels run
    w, _, _ = expert_bank(4, 256, 128, "q4_g64", "q5_g64", seed=0)
    sw, _, _ = shared_expert(256, 128, "q8_g32", seed=1)
    moe = TritonMoe(fused_dtypes=(ACT,))
    assert moe.takes_pairs(4, w, sw) and not moe.takes_pairs(5, w, sw) and not moe.takes_pairs(1, w, None)
    assert not TritonMoe(fused_dtypes=(ACT,), pairs=False).takes_pairs(1, w, sw)
    wd, _, _ = expert_bank(4, 256, 128, "bf16", "bf16", seed=0)
    assert not moe.takes_pairs(1, wd, sw)  # dense experts: the tiles


E, H, I, TOP_K = 256, 2048, 512, 8
GPU_RECIPES = [("q4_g64", "q5_g64", "q8_g32"), ("q4_g64", "q6_g64", "q8_g32"), ("q8_g32", "q8_g32", "q8_g32")]


@pytest.fixture(scope="module", params=GPU_RECIPES, ids=lambda r: "/".join(r))
def real(request):
    gu, dn, sh = request.param
    bank = expert_bank(E, H, I, gu, dn, seed=0)
    yield bank, shared_expert(H, I, sh, seed=1)
    del bank
    torch.cuda.empty_cache()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_gpu_pairs_real_shapes(real, T):
    bank, shared = real
    out, ref = _run(bank, shared, T, TOP_K, seed=T)
    _close(out, ref)
    again, _ = _run(bank, shared, T, TOP_K, seed=T)
    assert torch.equal(out, again)
    if T == 1:
        plain, _ = _run(bank, shared, T, TOP_K, seed=T, moe=TritonMoe(fused_dtypes=(ACT,), fast=False))
        _close(plain, ref)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("early", [False, True])
def test_gpu_pairs_replay_in_a_cuda_graph(real, T, early, monkeypatch):
    """Replayed over changing routings: the oracle's results. early (NINFER_MOE_EARLY=1, under
    PDL): down reads the router's ids and its weights before its wait, trusting gate_up to let it
    go only past gate_up's own wait; a stale id would show as a wrong expert's rows, and the bits
    must equal the default order's, run eagerly after each replay."""
    (w, gu, dn), (sw, sdec, sg) = real
    moe = TritonMoe(fused_dtypes=(ACT,))
    x = torch.randn(T, H, device="cuda").bfloat16()
    logits = torch.randn(T, E, device="cuda")

    def step():
        r = route(logits, TOP_K, x=x, shared_gate_weight=sg)
        return moe.run(x, r, w, sw), r

    monkeypatch.setenv("NINFER_MOE_EARLY", "1" if early else "0")
    graph, (out, r) = captured(step, warmups=2)
    monkeypatch.setenv("NINFER_MOE_EARLY", "0")
    for seed in range(12 if early else 3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x.copy_(torch.randn(T, H, generator=g, device="cuda").bfloat16())
        logits.copy_(torch.randn(T, E, generator=g, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        if early:
            plain, r_plain = step()
            torch.cuda.synchronize()
            assert torch.equal(r.ids, r_plain.ids) and torch.equal(out, plain), seed
        if not early or seed % 4 == 0:
            ref = experts_reference(x, r.ids[:, :TOP_K].long(), r.weights[:, :TOP_K], gu, dn, sdec, r.weights[:, TOP_K])
            _close(out, ref)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("which", ["first", "split"])
def test_gpu_earlier_pair_configs_equal_the_oracle(real, T, which):
    # the first block sizes (pair_gemv.FIRST_*), and the sweep's winners that were the defaults
    # until one-slice gate_up (SPLIT_GATE_UP / WIDE_DOWN): gate_up over several K slices, with
    # the counter and the last CTA's sum
    (w, gu, dn), (sw, sdec, sg) = real
    cu, cd = (PG.FIRST_GATE_UP, PG.FIRST_DOWN) if which == "first" else (PG.SPLIT_GATE_UP, PG.WIDE_DOWN)
    g = torch.Generator(device=DEV).manual_seed(T)
    x = torch.randn(T, H, generator=g, device=DEV).bfloat16()
    r = route(logits_hitting(T, E, seed=T), TOP_K, x=x, shared_gate_weight=sg)
    h = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, I, E, cu)
    out = PG.down(h, r.ids, r.weights, w.down, sw.down, H, E, torch.bfloat16, cd)
    ref = experts_reference(x, r.ids[:, :TOP_K].long(), r.weights[:, :TOP_K], gu, dn, sdec, r.weights[:, TOP_K])
    _close(out, ref)


ONE_SLICE = PG.one_slice_candidates(H)
SMALL_DOWN = PG.SMALL_DOWN_CANDIDATES


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 4])
def test_gpu_one_slice_gate_up_and_small_down_equal_the_oracle(real, T, monkeypatch):
    """gate_up with its K slice the whole of H (each chunk in one CTA, no counter) and down with
    fewer rows a chunk (the configs bench/moe.py's pair sweep times with NINFER_SWEEP_ONEK=1):
    the oracle's output, bit for bit the same on a second run (gate_up's with the counters
    poisoned), and through NINFER_PAIR_GATE_UP / NINFER_PAIR_DOWN in TritonMoe.run."""
    (w, gu, dn), (sw, sdec, sg) = real
    g = torch.Generator(device=DEV).manual_seed(T + 20)
    x = torch.randn(T, H, generator=g, device=DEV).bfloat16()
    r = route(logits_hitting(T, E, seed=T + 20), TOP_K, x=x, shared_gate_weight=sg)
    ref = experts_reference(x, r.ids[:, :TOP_K].long(), r.weights[:, :TOP_K], gu, dn, sdec, r.weights[:, TOP_K])
    for cfg in ONE_SLICE:
        h = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, I, E, cfg)
        out = PG.down(h, r.ids, r.weights, w.down, sw.down, H, E, torch.bfloat16)
        _close(out, ref)
        ws = QK.Workspace.get(x.device)
        saved = ws.counters.clone()
        ws.counters.fill_(5)
        torch.cuda.synchronize()
        again = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, I, E, cfg)
        torch.cuda.synchronize()
        assert bool((ws.counters == 5).all())
        ws.counters.copy_(saved)
        assert torch.equal(h, again), cfg.describe()
    h = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, I, E)
    for cfg in SMALL_DOWN:
        out = PG.down(h, r.ids, r.weights, w.down, sw.down, H, E, torch.bfloat16, cfg)
        _close(out, ref)
        assert torch.equal(out, PG.down(h, r.ids, r.weights, w.down, sw.down, H, E, torch.bfloat16, cfg))
    monkeypatch.setenv("NINFER_PAIR_GATE_UP", "8:16:8:4")
    monkeypatch.setenv("NINFER_PAIR_DOWN", "16:4:16:2")
    assert PG.configs_for(H, I) == (ONE_SLICE[0], SMALL_DOWN[0])
    out, ref2 = _run((w, gu, dn), (sw, sdec, sg), T, TOP_K, seed=T + 20)
    _close(out, ref2)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 4])
def test_gpu_nvfp4_pairs_real_shapes(T):
    bank = expert_bank(E, H, I, "nvfp4", "nvfp4", seed=0)
    shared = shared_expert(H, I, "nvfp4", seed=1)
    out, ref = _run(bank, shared, T, TOP_K, seed=T)
    _close(out, ref)


def _fold_case(T, seed, monkeypatch, dtype=ACT):
    """TritonMoe.forward_layer_add_norm (NINFER_MOE_NORM=1: the residual add and norm inside
    route_gemv) against rmsnorm(residual += delta) then forward_layer, on one bank."""
    import types

    from ninfer.kernels.triton.norms import rmsnorm
    from ninfer_plugins.moe_triton import moe as M

    for name in ("NINFER_MOE_NORM", "NINFER_MOE_BLOCK", "NINFER_MOE_BLOCK_NORM"):
        monkeypatch.delenv(name, raising=False)
    H, I, E = (256, 128, 8) if not CUDA else (2048, 512, 256)
    (w, _, _), (sw, _, _) = expert_bank(E, H, I, "q4_g64", "q5_g64", seed=seed), shared_expert(H, I, "q8_g32", seed=seed + 1)
    g = torch.Generator(device=DEV).manual_seed(seed)
    router = (torch.randn(E, H, generator=g, device=DEV) * 2 / H**0.5).to(dtype)
    moe = TritonMoe(fused_dtypes=(dtype,))
    layer = types.SimpleNamespace(top_k=3 if not CUDA else 8, experts=None)
    monkeypatch.setattr(moe, "_weights", lambda bank: w)
    monkeypatch.setattr(M, "shared_weights", lambda m: sw)
    monkeypatch.setattr(moe, "_fused_router", lambda m, x, ww, s: router if x.shape[0] == 1 else None)
    delta = torch.randn(T, H, generator=g, device=DEV).to(dtype)
    residual = (torch.randn(T, H, generator=g, device=DEV) * 3).to(dtype)
    nw = (torch.randn(H, generator=g, device=DEV) * 0.2).to(dtype)
    assert moe.forward_layer_add_norm(layer, delta, residual.clone(), nw, 1e-6) is None  # off by default
    monkeypatch.setenv("NINFER_MOE_NORM", "1")
    res_fold, res_ref = residual.clone(), residual.clone()
    out = moe.forward_layer_add_norm(layer, delta, res_fold, nw, 1e-6)
    ref = moe.forward_layer(layer, rmsnorm(delta, nw, 1e-6, residual=res_ref))
    return out, ref, res_fold, res_ref


@interp
def test_interpreted_residual_add_and_norm_folded_into_the_router(monkeypatch):
    out, ref, res_fold, res_ref = _fold_case(1, seed=3, monkeypatch=monkeypatch)
    assert torch.equal(res_fold, res_ref)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@interp
def test_interpreted_fold_declines_where_route_gemv_does_not_serve(monkeypatch):
    # two tokens: route_gemv is not the router there, so the caller keeps its own norm launch
    import types

    monkeypatch.setenv("NINFER_MOE_NORM", "1")
    for name in ("NINFER_MOE_BLOCK", "NINFER_MOE_BLOCK_NORM", "NINFER_MOE_BLOCK_MAX_T"):
        monkeypatch.delenv(name, raising=False)
    moe = TritonMoe(fused_dtypes=(ACT,))
    (w, _, _), (sw, _, _) = expert_bank(8, 256, 128, "q4_g64", "q5_g64", seed=0), shared_expert(256, 128, "q8_g32", seed=1)
    from ninfer_plugins.moe_triton import moe as M

    monkeypatch.setattr(moe, "_weights", lambda bank: w)
    monkeypatch.setattr(M, "shared_weights", lambda m: sw)
    x = torch.zeros(2, 256, dtype=ACT, device=DEV)
    assert moe.forward_layer_add_norm(types.SimpleNamespace(top_k=3, experts=None, gate=None), x, x.clone(),
                                      torch.zeros(256, dtype=ACT, device=DEV), 1e-6) is None


@pytest.mark.gpu
@needs_cuda
def test_gpu_residual_add_and_norm_folded_into_the_router(monkeypatch):
    out, ref, res_fold, res_ref = _fold_case(1, seed=4, monkeypatch=monkeypatch, dtype=torch.bfloat16)
    assert torch.equal(res_fold, res_ref)
    # the folded norm sums its squares in one warp: h may differ in a last bit, rarely a routing
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < 2e-2


def _down_fold_case(T, seed, gu="q4_g64", dn="q5_g64", sh="q8_g32"):
    from ninfer.kernels.triton.norms import rmsnorm

    H, I, E, top_k = (256, 128, 8, 3) if not CUDA else (2048, 512, 256, 8)
    (w, _, _), (sw, _, sg) = expert_bank(E, H, I, gu, dn, seed=seed), shared_expert(H, I, sh, seed=seed + 1)
    g = torch.Generator(device=DEV).manual_seed(seed)
    dt = ACT if not CUDA else torch.bfloat16
    x = torch.randn(T, H, generator=g, device=DEV).to(dt)
    r = route(logits_hitting(T, E, seed=seed), top_k, x=x, shared_gate_weight=sg)
    h = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, I, E)
    residual = (torch.randn(T, H, generator=g, device=DEV) * 3).to(dt)
    nw = (torch.randn(H, generator=g, device=DEV) * 0.2).to(dt)
    res_ref = residual.clone()
    y_ref = PG.down(h, r.ids, r.weights, w.down, sw.down, H, E, dt)
    n_ref = rmsnorm(y_ref, nw, 1e-6, residual=res_ref)
    res_fold, normed = residual.clone(), torch.full_like(residual, float("nan"))
    y = PG.down(h, r.ids, r.weights, w.down, sw.down, H, E, dt, add_norm=(res_fold, nw, 1e-6, normed))
    return (y, res_fold, normed), (y_ref, res_ref, n_ref)


@interp
@pytest.mark.parametrize("T", [1, 3])
def test_interpreted_pair_down_with_the_residual_add_and_norm(T):
    (y, res, normed), (y_ref, res_ref, n_ref) = _down_fold_case(T, seed=T + 20)
    assert torch.equal(y, y_ref) and torch.equal(res, res_ref)
    torch.testing.assert_close(normed, n_ref, atol=1e-5, rtol=1e-5)
    assert int(QK_workspace_counters().abs().sum()) == 0


def QK_workspace_counters():
    from ninfer_plugins.quant_int import kernels as QK

    return QK.Workspace.get(torch.device(DEV)).counters


@interp
def test_interpreted_moe_run_folds_the_add_norm_only_when_switched_on(monkeypatch):
    from ninfer.linear import AddNorm

    bank, shared = expert_bank(8, 256, 128, "q4_g64", "q5_g64", seed=5), shared_expert(256, 128, "q8_g32", seed=6)
    (w, _, _), (sw, _, sg) = bank, shared
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(5)).to(ACT)
    r = route(logits_hitting(1, 8, seed=5), 3, x=x, shared_gate_weight=sg)
    moe = TritonMoe(fused_dtypes=(ACT,))
    an = AddNorm(torch.zeros(1, 256, dtype=ACT), torch.zeros(256, dtype=ACT), 1e-6)
    y = moe.run(x, r, w, sw, an)
    assert an.out is None and bool((an.residual == 0).all())  # off by default: nothing folded
    monkeypatch.setenv("NINFER_GEMV_NORM", "1")
    y2 = moe.run(x, r, w, sw, an)
    assert torch.equal(y, y2) and an.out is not None
    assert torch.equal(an.residual, y.to(ACT))  # 0 + y, rounded to the residual's dtype


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 4])
def test_gpu_pair_down_with_the_residual_add_and_norm(T):
    (y, res, normed), (y_ref, res_ref, n_ref) = _down_fold_case(T, seed=T + 30)
    assert torch.equal(y, y_ref) and torch.equal(res, res_ref)
    torch.testing.assert_close(normed.float(), n_ref.float(), atol=0, rtol=1e-2)
