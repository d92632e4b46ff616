"""The one-launch decode MoE layer (moe_block.py) against the three launches it replaces
(route_gemv, then pair_gemv's gate_up and down) and the fp32 oracle of the decoded weights.

CPU (CI): interpreted, E 8, H 256, I 128, top 3, T = 1..4; the interpreter runs the items in
ticket order, so it checks the item mapping, the bits and the counters, not the waits.
GPU (`-m gpu`): the real shapes (256 experts, H 2048, I 512, top 8) of the int4 recipe, every
call twice (bit-reproducible, counters reset), in a CUDA graph over changing inputs; here the
waits run for real (a hang fails by the test timeout)."""

from __future__ import annotations

import pytest
import torch
from moe_cases import ACT, DEV, expert_bank, shared_expert

from ninfer.kernels import reference as R
from ninfer.kernels.triton.launch import interpreting
from ninfer_plugins.moe_triton import moe_block as MB
from ninfer_plugins.moe_triton import pair_gemv as PG
from ninfer_plugins.moe_triton.grouped_gemv import experts_reference
from ninfer_plugins.moe_triton.router import route_gemv
from ninfer_plugins.quant_int import kernels as QK

CUDA = torch.cuda.is_available()
interp = pytest.mark.skipif(not interpreting(), reason="interpreter tests run where there is no GPU (CI)")
needs_cuda = pytest.mark.skipif(not CUDA or interpreting(), reason="needs a CUDA device")
ATOL, RTOL = R.TOLERANCES["bf16_reduction"]


def _layer(E, H, I, gu, dn, sh, seed, dtype=ACT):
    (w, dgu, ddn), (sw, sdec, sg) = expert_bank(E, H, I, gu, dn, seed=seed), shared_expert(H, I, sh, seed=seed + 1)
    g = torch.Generator(device=DEV).manual_seed(seed + 2)
    # a router that spreads the choices (a logit scale of a few units)
    router = (torch.randn(E, H, generator=g, device=DEV) * 3 / H**0.5).to(dtype)
    return w, sw, router, sg.to(dtype), (dgu, ddn, sdec)


def _block(x, w, sw, router, sg, top_k, **kw):
    kw.setdefault("topk_keys", False)  # _top_k unless a test asks (NINFER_MOE_BLOCK_TOPK may be set)
    return MB.moe_block(x, router, sg, top_k, w.gate_up, sw.gate, sw.up, w.down, sw.down, w.inner, w.num_experts, **kw)


def _three_launches(x, w, sw, router, sg, top_k):
    ws = QK.Workspace.get(x.device)
    ws.ensure(4 * (w.num_experts + 1), 1, False)
    r = route_gemv(x, router, top_k, sg, (ws.partials, ws.counters))
    h = PG.gate_up(x, r.ids, w.gate_up, sw.gate, sw.up, w.inner, w.num_experts)
    return PG.down(h, r.ids, r.weights, w.down, sw.down, w.hidden, w.num_experts, x.dtype), r


def _counters_zero(x, w, top_k):
    sc = MB.scratch(x.device, x.dtype, w.num_experts, top_k + 1, w.hidden, w.inner)
    return all(int(sc[k].abs().sum()) == 0 for k in ("cnt", "gcnt", "dcnt"))


@interp
@pytest.mark.parametrize("gu,dn,sh", [("q4_g64", "q5_g64", "q8_g32"), ("q8_g32", "q6_g64", "q4_g64"),
                                      ("nvfp4", "nvfp4", "q8_g32")])
@pytest.mark.parametrize("T", [1, 3])
def test_interpreted_block_equals_the_three_launches(gu, dn, sh, T):
    top_k = 3
    w, sw, router, sg, (dgu, ddn, sdec) = _layer(8, 256, 128, gu, dn, sh, seed=T)
    g = torch.Generator(device=DEV).manual_seed(10 + T)
    x = torch.randn(T, 256, generator=g, device=DEV).to(ACT)
    out, ids, weights = _block(x, w, sw, router, sg, top_k)
    ref, r = _three_launches(x, w, sw, router, sg, top_k)
    assert torch.equal(ids, r.ids) and torch.equal(weights, r.weights)
    assert torch.equal(out, ref)
    oracle = experts_reference(x, ids[:, :top_k].long(), weights[:, :top_k], dgu, ddn, sdec, weights[:, top_k])
    err = (out.double() - oracle.double()).abs()
    assert float(err.norm() / oracle.double().norm()) <= RTOL
    assert _counters_zero(x, w, top_k)
    # a second call on the same scratch: same bits (the counters were put back)
    again, _, _ = _block(x, w, sw, router, sg, top_k)
    assert torch.equal(out, again)


@interp
@pytest.mark.parametrize("T", [1, 3])
def test_interpreted_block_with_the_key_top_k(T):
    # router.py's _top_k_keys in the routing item: the same experts, weights to a few ulps
    top_k = 3
    w, sw, router, sg, _ = _layer(8, 256, 128, "q4_g64", "q5_g64", "q8_g32", seed=20 + T)
    x = torch.randn(T, 256, generator=torch.Generator(device=DEV).manual_seed(T), device=DEV).to(ACT)
    out, ids, weights = _block(x, w, sw, router, sg, top_k, topk_keys=True)
    ref, r = _three_launches(x, w, sw, router, sg, top_k)
    assert torch.equal(ids, r.ids)
    torch.testing.assert_close(weights, r.weights, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert _counters_zero(x, w, top_k)


@interp
def test_interpreted_block_with_more_router_rows_an_item():
    # 9 rows (8 experts + the shared gate) over items of 1, 2 and 16 rows: a last item that is
    # partly past the rows, and one item holding them all
    w, sw, router, sg, _ = _layer(8, 256, 128, "q4_g64", "q5_g64", "q8_g32", seed=5)
    x = torch.randn(2, 256, generator=torch.Generator(device=DEV).manual_seed(1), device=DEV).to(ACT)
    outs = [_block(x, w, sw, router, sg, 3, rows_per_item=rb) for rb in (1, 2, 16)]
    for out, ids, weights in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(ids, outs[0][1]) and torch.equal(weights, outs[0][2])


def _add_norm_case(T, seed, E=8, H=256, I=128, top_k=3, dtype=ACT):
    """The block with the post-mixer residual add and norm against route_gemv's fold of it, then
    the pair kernels (both compute the norm with router.py's _add_norm_row)."""
    w, sw, router, sg, _ = _layer(E, H, I, "q4_g64", "q5_g64", "q8_g32", seed=seed, dtype=dtype)
    g = torch.Generator(device=DEV).manual_seed(seed + 7)
    delta = torch.randn(T, H, generator=g, device=DEV).to(dtype)
    residual = (torch.randn(T, H, generator=g, device=DEV) * 3).to(dtype)
    nw = (torch.randn(H, generator=g, device=DEV) * 0.2).to(dtype)
    res_b, xn_b = residual.clone(), torch.empty_like(delta)
    out, ids, weights = _block(delta, w, sw, router, sg, top_k, add_norm=(res_b, nw, 1e-6, xn_b))
    ws = QK.Workspace.get(delta.device)
    ws.ensure(4 * (E + 1), 1, False)
    res_r, xn_r = residual.clone(), torch.empty_like(delta)
    r = route_gemv(delta, router, top_k, sg, (ws.partials, ws.counters), add_norm=(res_r, nw, 1e-6, xn_r))
    h = PG.gate_up(xn_r, r.ids, w.gate_up, sw.gate, sw.up, w.inner, w.num_experts)
    ref = PG.down(h, r.ids, r.weights, w.down, sw.down, w.hidden, w.num_experts, delta.dtype)
    return (out, ids, res_b, xn_b), (ref, r.ids, res_r, xn_r), w, top_k


@interp
@pytest.mark.parametrize("T", [1, 2])
def test_interpreted_block_with_the_residual_add_and_norm(T):
    (out, ids, res_b, xn_b), (ref, rids, res_r, xn_r), w, top_k = _add_norm_case(T, seed=T)
    assert torch.equal(res_b, res_r) and torch.equal(xn_b, xn_r)
    assert torch.equal(ids, rids) and torch.equal(out, ref)
    assert _counters_zero(xn_b, w, top_k)


@interp
def test_interpreted_block_trace_rows():
    # a trace row per item, at the item's own index (times are zeros under the interpreter); the
    # output is the untraced one's
    w, sw, router, sg, _ = _layer(8, 256, 128, "q4_g64", "q5_g64", "q8_g32", seed=6)
    x = torch.randn(2, 256, generator=torch.Generator(device=DEV).manual_seed(6), device=DEV).to(ACT)
    counts = MB.item_count(2, 3, 256, 128, 8)
    n = sum(counts)
    trace = torch.full((n + 3, 4), -1, dtype=torch.int64, device=DEV)
    out, _, _ = _block(x, w, sw, router, sg, 3, trace=trace)
    assert torch.equal(out, _block(x, w, sw, router, sg, 3)[0])
    assert torch.equal(trace[:n, 0].cpu(), torch.arange(n)) and bool((trace[n:] == -1).all())
    summary = MB.summarize_trace(trace, counts, 2, 3)
    assert summary["kernel: last end"] == 0.0 and "gate_up routed: last past its wait" in summary
    with pytest.raises(ValueError, match="trace"):
        _block(x, w, sw, router, sg, 3, trace=trace[: n - 1])


@interp
def test_interpreted_block_with_other_pair_configs():
    # larger gate_up / down items (more rows a chunk, 4 warps on trips twice as wide, whose tiles
    # cover 4 warps at these small K): the same routing and the output to rounding
    top_k = 3
    w, sw, router, sg, _ = _layer(8, 256, 128, "q4_g64", "q5_g64", "q8_g32", seed=12)
    x = torch.randn(1, 256, generator=torch.Generator(device=DEV).manual_seed(12), device=DEV).to(ACT)
    base, ids, _ = _block(x, w, sw, router, sg, top_k)
    gu, dn = PG.configs_for(256, 128)
    for cfgs in ((PG.PairConfig(2 * gu.block_n, gu.kbs, 2 * gu.rows, 4),
                  PG.PairConfig(2 * dn.block_n, dn.kbs, 2 * dn.rows, 4)),
                 (PG.PairConfig(gu.block_n, gu.kbs, 4 * gu.rows, 2), dn)):
        out, ids2, _ = _block(x, w, sw, router, sg, top_k, configs=cfgs)
        assert torch.equal(ids2, ids)
        torch.testing.assert_close(out, base, rtol=1e-5, atol=1e-6)
        assert _counters_zero(x, w, top_k)
    with pytest.raises(ValueError, match="more scratch"):  # more K slices than the scratch holds
        _block(x, w, sw, router, sg, top_k, configs=(PG.PairConfig(gu.block_n, 1, gu.rows, 2), dn))


@interp
def test_block_refuses_what_it_cannot_serve():
    w, sw, router, sg, _ = _layer(8, 256, 128, "q4_g64", "q5_g64", "q8_g32", seed=0)
    x = torch.zeros(5, 256, dtype=ACT, device=DEV)
    with pytest.raises(ValueError, match="1..4 tokens"):
        _block(x, w, sw, router, sg, 3)
    with pytest.raises(ValueError, match="1..4 tokens"):
        _block(x[:0], w, sw, router, sg, 3)
    with pytest.raises(ValueError, match="dense router"):
        _block(x[:1], w, sw, router[:, :128], sg, 3)
    with pytest.raises(ValueError, match="x's dtype"):
        _block(x[:1], w, sw, router, sg.double(), 3)
    for rb in (0, 17):
        with pytest.raises(ValueError, match="router rows"):
            _block(x[:1], w, sw, router, sg, 3, rows_per_item=rb)
    with pytest.raises(ValueError, match="add_norm"):
        _block(x[:1], w, sw, router, sg, 3, add_norm=(x[:2], x[0], 1e-6, x[:1]))


@interp
def test_triton_moe_takes_the_block_only_when_switched_on(monkeypatch):
    import types

    from ninfer_plugins.moe_triton import moe as M
    from ninfer_plugins.moe_triton.moe import TritonMoe

    for name in ("NINFER_MOE_BLOCK", "NINFER_MOE_BLOCK_NORM", "NINFER_MOE_NORM", "NINFER_GEMV_NORM", "NINFER_MOE_BLOCK_TOPK",
                 "NINFER_MOE_BLOCK_MAX_T"):
        monkeypatch.delenv(name, raising=False)
    w, sw, router, sg, _ = _layer(8, 256, 128, "q4_g64", "q5_g64", "q8_g32", seed=3)
    moe = TritonMoe(fused_dtypes=(ACT,))
    layer = types.SimpleNamespace(top_k=3, experts=None)
    monkeypatch.setattr(moe, "_weights", lambda bank: w)
    monkeypatch.setattr(M, "shared_weights", lambda m: sw)
    monkeypatch.setattr(moe, "_fused_router", lambda m, x, ww, s: router if x.shape[0] == 1 else None)
    calls = []
    real = MB.moe_block
    monkeypatch.setattr(MB, "moe_block", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(1, 256, generator=torch.Generator(device=DEV).manual_seed(2), device=DEV).to(ACT)
    plain = moe.forward_layer(layer, x)
    assert not calls
    monkeypatch.setenv("NINFER_MOE_BLOCK", "1")
    fused = moe.forward_layer(layer, x)
    assert calls and torch.equal(fused, plain)
    # the post-mixer add and norm: only with NINFER_MOE_BLOCK_NORM=1, and then as route_gemv folds it
    residual = torch.randn(1, 256, generator=torch.Generator(device=DEV).manual_seed(3), device=DEV).to(ACT)
    nw = torch.full((256,), 0.1, dtype=ACT, device=DEV)
    assert moe.forward_layer_add_norm(layer, x, residual.clone(), nw, 1e-6) is None
    monkeypatch.setenv("NINFER_MOE_BLOCK_NORM", "1")
    res_b = residual.clone()
    calls.clear()
    out_b = moe.forward_layer_add_norm(layer, x, res_b, nw, 1e-6)
    assert calls
    monkeypatch.setenv("NINFER_MOE_BLOCK", "0")
    monkeypatch.setenv("NINFER_MOE_NORM", "1")
    res_r = residual.clone()
    out_r = moe.forward_layer_add_norm(layer, x, res_r, nw, 1e-6)
    assert torch.equal(res_b, res_r) and torch.equal(out_b, out_r)


def _torch_gated_moe(monkeypatch, seed):
    """A TritonMoe over one tiny layer (8 experts, q4 gate_up, q5 down, q8 shared) whose router
    linear is a torch linear with the dense weight _fused_router reads: (moe, layer, weights)."""
    import types

    from ninfer_plugins.moe_triton import moe as M
    from ninfer_plugins.moe_triton.moe import TritonMoe

    w, sw, router, _, _ = _layer(8, 256, 128, "q4_g64", "q5_g64", "q8_g32", seed=seed)

    def gate(x):  # the router linear of the path without the block
        return torch.nn.functional.linear(x, router)

    gate.prepared = router  # what _fused_router reads
    layer = types.SimpleNamespace(top_k=3, experts=None, gate=gate)
    moe = TritonMoe(fused_dtypes=(ACT,))
    monkeypatch.setattr(moe, "_weights", lambda bank: w)
    monkeypatch.setattr(M, "shared_weights", lambda m: sw)
    return moe, layer, w


def _token_counts(monkeypatch, owner, name, real) -> list:
    """owner.name replaced by `real` that also records each call's token count (its first
    argument's rows): the list it records into."""
    calls = []
    monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    return calls


@interp
@pytest.mark.parametrize("path", ["block", "route_gemv"])
def test_triton_moe_takes_a_one_launch_path_for_3_tokens_only_when_asked(path, monkeypatch):
    """A 3-token call (a speculative verify) goes to the one-launch block under
    NINFER_MOE_BLOCK=1 NINFER_MOE_BLOCK_MAX_T=3, or routes in route_gemv's one launch under
    NINFER_ROUTE_GEMV_T=3, instead of the router linear + route + pair kernels it takes otherwise
    (the logits of a torch linear and of the kernels' dots may differ in their last bits: close,
    not equal); by default, and with the limit at 2, it does not."""
    from ninfer_plugins.moe_triton import moe as M
    from ninfer_plugins.moe_triton import router as R

    for name in ("NINFER_MOE_BLOCK", "NINFER_MOE_BLOCK_NORM", "NINFER_MOE_NORM", "NINFER_GEMV_NORM", "NINFER_MOE_BLOCK_MAX_T",
                 "NINFER_MOE_BLOCK_TOPK", "NINFER_ROUTE_GEMV_T"):
        monkeypatch.delenv(name, raising=False)
    moe, layer, _ = _torch_gated_moe(monkeypatch, seed=8)
    if path == "block":
        calls, limit = _token_counts(monkeypatch, MB, "moe_block", MB.moe_block), "NINFER_MOE_BLOCK_MAX_T"
    else:
        calls, limit = _token_counts(monkeypatch, M, "route_gemv", R.route_gemv), "NINFER_ROUTE_GEMV_T"
    x = torch.randn(3, 256, generator=torch.Generator(device=DEV).manual_seed(4), device=DEV).to(ACT)
    plain = moe.forward_layer(layer, x)
    if path == "block":
        monkeypatch.setenv("NINFER_MOE_BLOCK", "1")
    assert torch.equal(moe.forward_layer(layer, x), plain) and not calls  # one token only by default
    monkeypatch.setenv(limit, "3")
    fused = moe.forward_layer(layer, x)
    assert calls == [3]
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)
    monkeypatch.setenv(limit, "2")
    calls.clear()
    assert torch.equal(moe.forward_layer(layer, x), plain) and not calls
    if path == "block":
        assert MB.max_tokens() == 2
        monkeypatch.setenv(limit, "99")
        assert MB.max_tokens() == 4
    else:
        monkeypatch.setenv(limit, "5")
        with pytest.raises(ValueError, match=limit):
            moe.forward_layer(layer, x)


# --- GPU -------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T,fast", [(1, True), (2, True), (3, True), (4, True), (1, False)])
def test_gpu_block_real_shapes(T, fast):
    top_k = 8
    w, sw, router, sg, (dgu, ddn, sdec) = _layer(256, 2048, 512, "q4_g64", "q5_g64", "q8_g32", seed=T,
                                                 dtype=torch.bfloat16)
    x = torch.randn(T, 2048, generator=torch.Generator(device=DEV).manual_seed(T), device=DEV).to(torch.bfloat16)
    out, ids, weights = _block(x, w, sw, router, sg, top_k, fast=fast)
    torch.cuda.synchronize()
    assert _counters_zero(x, w, top_k)
    ref, r = _three_launches(x, w, sw, router, sg, top_k)
    # the router's dots sum in another order than route_gemv's one warp: a logit may differ in
    # its last bit, which can swap two near-equal experts; the oracle of the block's own routing
    # is the check, and most routings agree with the three launches
    oracle = experts_reference(x.float(), ids[:, :top_k].long(), weights[:, :top_k], dgu, ddn, sdec, weights[:, top_k])
    err = (out.double() - oracle.double()).abs()
    assert float(err.norm() / oracle.double().norm()) <= RTOL
    assert float((ids == r.ids).float().mean()) >= 0.75
    for _ in range(3):
        again, ids2, _ = _block(x, w, sw, router, sg, top_k, fast=fast)
        assert torch.equal(again, out) and torch.equal(ids2, ids)


@pytest.mark.gpu
@needs_cuda
def test_gpu_block_with_the_residual_add_and_norm():
    (out, ids, res_b, xn_b), (ref, rids, res_r, xn_r), w, top_k = _add_norm_case(
        1, seed=4, E=256, H=2048, I=512, top_k=8, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    assert torch.equal(res_b, res_r)
    # the norm's sum of squares runs over 2 warps here, 1 in route_gemv: x may differ in a last bit
    assert float((xn_b.float() - xn_r.float()).abs().max()) <= 2e-2 * float(xn_r.float().abs().max())
    if torch.equal(ids, rids):
        assert float((out.float() - ref.float()).norm() / ref.float().norm()) < 2e-2
    assert _counters_zero(xn_b, w, top_k)


@pytest.mark.gpu
@needs_cuda
def test_gpu_block_in_a_cuda_graph():
    top_k = 8
    w, sw, router, sg, _ = _layer(256, 2048, 512, "q4_g64", "q5_g64", "q8_g32", seed=9, dtype=torch.bfloat16)
    x = torch.zeros(1, 2048, dtype=torch.bfloat16, device=DEV)
    _block(x, w, sw, router, sg, top_k)  # scratch made and kernels compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [_block(x, w, sw, router, sg, top_k) for _ in range(4)]  # four layers' worth, back to back
    for seed in range(3):
        x.copy_(torch.randn(1, 2048, generator=torch.Generator(device=DEV).manual_seed(seed), device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        eager, ids, _ = _block(x, w, sw, router, sg, top_k)
        for out, gids, _ in outs:
            assert torch.equal(out, eager) and torch.equal(gids, ids)
    # many replays back to back (each four launches on one scratch), then the counters
    for _ in range(500):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(outs[-1][0], _block(x, w, sw, router, sg, top_k)[0])
    assert _counters_zero(x, w, top_k)
