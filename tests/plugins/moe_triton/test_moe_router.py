"""The fused router against spec 2.5's torch oracle (softmax in fp32, top-k, renormalise), the
shared gate in both modes, and the fused decode plan against the torch plan (bit for bit).

CPU (CI): interpreted, tiny shapes, non-power-of-two expert counts, T = 1 and 16, boundary ids.
GPU (`-m gpu`): 256 experts, top 8, T = 1..16 fused and prefill-sized T, and a CUDA graph replay
with fresh logits.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from moe_cases import DEV, captured, logits_hitting

from ninfer.kernels.triton.launch import interpreting
from ninfer_plugins.moe_triton.grouped_gemm import plan_tiles
from ninfer_plugins.moe_triton.router import DECODE_BLOCK_M, _top_k_keys, max_tiles, route, route_reference

CUDA = torch.cuda.is_available()
interp = pytest.mark.skipif(not interpreting(), reason="interpreter tests run where there is no GPU (CI)")
needs_cuda = pytest.mark.skipif(not CUDA or interpreting(), reason="needs a CUDA device")


def _check(logits, top_k, plan, shared=None, x=None, sg=None):
    kw = {}
    if shared == "dot":
        kw = dict(x=x, shared_gate_weight=sg)
    elif shared == "logit":
        kw = dict(shared_gate_logit=(x.float() @ sg.float().T))
    r = route(logits, top_k, plan=plan, **kw)
    ids, w = route_reference(logits, top_k)
    mine = r.ids[:, :top_k].long()
    if logits.dtype == torch.float32:
        assert torch.equal(mine, ids)
    else:
        # 16-bit logits tie often; any tied choice is a top-k (torch's order among ties is
        # unspecified, ours takes the lower id): the chosen probabilities must be the top-k ones
        probs = torch.softmax(logits.float(), -1)
        vals = probs.gather(1, mine)
        assert torch.equal(vals, probs.gather(1, ids)) and bool((vals[:, :-1] >= vals[:, 1:]).all())
        w = vals / vals.sum(-1, keepdim=True)
    torch.testing.assert_close(r.weights[:, :top_k], w, atol=1e-6, rtol=1e-5)
    E = logits.shape[1]
    if shared:
        assert bool((r.ids[:, top_k] == E).all())
        gate = torch.sigmoid(x.float() @ sg.float().T).squeeze(-1)
        torch.testing.assert_close(r.weights[:, top_k], gate, atol=1e-5, rtol=1e-4)
    if plan:
        te, rows = plan_tiles(r.ids, E + 1, DECODE_BLOCK_M, r.n_tiles)
        assert torch.equal(r.tile_expert, te) and torch.equal(r.tile_rows, rows)
        # every pair sits in exactly one tile, under its own expert
        seen = r.tile_rows[r.tile_rows >= 0].long()
        assert sorted(seen.tolist()) == list(range(r.ids.numel()))
        owner = r.tile_expert.long().repeat_interleave(DECODE_BLOCK_M).view_as(r.tile_rows)[r.tile_rows >= 0]
        assert torch.equal(owner, r.ids.reshape(-1)[seen].long())
    return r


@interp
@pytest.mark.parametrize("T,E,top_k", [(1, 16, 4), (3, 20, 8), (16, 24, 3), (5, 256, 8)])
@pytest.mark.parametrize("shared", [None, "dot", "logit"])
def test_interpreted_decode_route_and_plan(T, E, top_k, shared):
    g = torch.Generator().manual_seed(T * 100 + E)
    x = torch.randn(T, 72, generator=g)
    sg = torch.randn(1, 72, generator=g) / 8
    _check(logits_hitting(T, E, seed=E + T), top_k, True, shared, x, sg)


@interp
@pytest.mark.parametrize("T,H", [(1, 72), (4, 2048), (16, 300)])
def test_interpreted_shared_gate_ahead_of_the_logits(T, H):
    """The shared gate's dot ahead of the logits, unrolled over H with one reduction, at widths
    that are and are not a multiple of its 256-wide blocks: the ids and routed weights as the
    reference routes them, the shared gate as torch computes it (`_check`), with and without
    the plan; the same routing given the gate as a logit."""
    g = torch.Generator().manual_seed(T + H)
    x = torch.randn(T, H, generator=g)
    sg = torch.randn(1, H, generator=g) / H**0.5
    logits = logits_hitting(T, 24, seed=T)
    dot = _check(logits, 4, T <= 16, "dot", x, sg)
    logit = _check(logits, 4, T <= 16, "logit", x, sg)
    assert torch.equal(dot.ids, logit.ids) and torch.equal(dot.weights[:, :4], logit.weights[:, :4])


@interp
def test_interpreted_every_token_same_experts():
    # one tile per expert holding all T tokens, and experts 0 and E-1 at both ends of the plan
    logits = torch.full((16, 12), -5.0)
    logits[:, 0], logits[:, 11], logits[:, 5] = 3.0, 2.0, 1.0
    logits += torch.randn(16, 12, generator=torch.Generator().manual_seed(0)) * 1e-3
    r = _check(logits, 3, True)
    assert r.tile_expert.tolist()[:3] == [0, 5, 11] and bool((r.tile_expert[3:] == -1).all())
    assert r.tile_rows[0].tolist() == [3 * t + 0 for t in range(16)]


@interp
@pytest.mark.parametrize("T", [17, 40])
def test_interpreted_prefill_route_bf16_logits(T):
    logits = logits_hitting(T, 20, seed=T).to(torch.bfloat16)
    x = torch.randn(T, 40, generator=torch.Generator().manual_seed(T))
    _check(logits, 4, False, "dot", x, torch.randn(1, 40) / 6)


@interp
@pytest.mark.parametrize("plan", [False, True])
def test_interpreted_nan_logits_route_in_bounds(plan):
    # a NaN row matches no maximum: its ids must still name experts (E = 20 is not a power of
    # two, so an unclamped pick would be 32, past the expert arrays), the other row is untouched
    logits = logits_hitting(2, 20, seed=3)
    logits[0, 5] = float("nan")
    r = route(logits, 4, plan=plan)
    assert int(r.ids.min()) >= 0 and int(r.ids.max()) < 20
    ids, _ = route_reference(logits[1:], 4)
    assert torch.equal(r.ids[1].long(), ids[0].long())


@triton.jit
def _key_top_k_probe(L, SG, IDS, W, T, E, TOP_K: tl.constexpr, SLOTS: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_E: tl.constexpr):
    t = tl.arange(0, BLOCK_T)
    e = tl.arange(0, BLOCK_E)
    ok = (t < T)[:, None] & (e < E)[None, :]
    lg = tl.load(L + t[:, None] * E + e[None, :], mask=ok, other=0.0)
    lg = tl.where((e < E)[None, :], lg, float("-inf"))
    _top_k_keys(lg, t, t < T, t.to(tl.int64), e, E, IDS, W, SG, 1, TOP_K, SLOTS, BLOCK_T, BLOCK_E)


@interp
def test_interpreted_key_top_k_picks_as_the_reference():
    """router._top_k_keys (the MoE block's fewer-reduction top-k) on logits with exact ties (the
    lower expert id first), negative values, -inf and a row past T: the experts route()'s top-k
    picks, weights equal to a few ulps, the shared gate's sigmoid in the last slot."""
    T, E, top_k = 3, 20, 4
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(5)) * 3
    logits[0, 3] = logits[0, 11] = logits[0, 17] = 9.0  # a three-way tie at the top: ids 3, 11, 17
    logits[1] = -logits[1].abs() - 1  # every logit negative
    logits[2, :10] = float("-inf")
    sg = torch.tensor([0.5, -1.0, 2.0, 7.0])
    ids = torch.full((4, top_k + 1), -7, dtype=torch.int32)
    w = torch.zeros(4, top_k + 1)
    _key_top_k_probe[(1,)](logits, sg, ids, w, T, E, TOP_K=top_k, SLOTS=top_k + 1, BLOCK_T=4, BLOCK_E=32)
    r = route(logits, top_k, shared_gate_logit=sg[:T, None])
    assert torch.equal(ids[:T], r.ids) and ids[0, :3].tolist() == [3, 11, 17]
    torch.testing.assert_close(w[:T], r.weights, rtol=1e-6, atol=1e-7)
    assert bool((ids[T] == -7).all()) and bool((w[T] == 0).all())  # the row past T is untouched


def test_tile_bound_holds_for_adversarial_routings():
    # max_tiles must cover any routing: spread evenly, all on one expert, one pair short of a tile
    for T, E, k, bm in ((64, 8, 2, 16), (100, 256, 8, 64), (33, 4, 4, 16)):
        n = max_tiles(T, k, E, bm, shared=True)
        ids_list = [
            torch.arange(T * k).remainder(E).view(T, k),
            (torch.arange(T)[:, None] * 0 + torch.arange(k)[None, :]),
            torch.randint(0, E, (T, k), generator=torch.Generator().manual_seed(T)),
        ]
        for ids in ids_list:
            ids = torch.cat([ids, torch.full((T, 1), E)], 1)
            counts = torch.bincount(ids.reshape(-1), minlength=E + 1)
            assert int(((counts + bm - 1) // bm).sum()) <= n
            te, rows = plan_tiles(ids, E + 1, bm, n)
            assert sorted(rows[rows >= 0].tolist()) == list(range(ids.numel()))


# --- GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 2, 7, 16])
@pytest.mark.parametrize("shared", [None, "dot"])
def test_gpu_real_shapes_decode(T, shared):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 2048, generator=g, device="cuda").bfloat16()
    sg = (torch.randn(1, 2048, generator=g, device="cuda") / 45).bfloat16()
    logits = (x @ (torch.randn(256, 2048, generator=g, device="cuda") / 45).bfloat16().T)
    _check(logits, 8, True, shared, x, sg)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [17, 1000, 8192])
def test_gpu_real_shapes_prefill(T):
    logits = logits_hitting(T, 256, seed=T)
    x = torch.randn(T, 2048, device="cuda").bfloat16()
    _check(logits, 8, False, "dot", x, (torch.randn(1, 2048, device="cuda") / 45).bfloat16())


@pytest.mark.gpu
@needs_cuda
def test_gpu_route_replays_in_a_cuda_graph():
    T = 4
    logits = logits_hitting(T, 256, seed=1)
    x = torch.randn(T, 2048, device="cuda").bfloat16()
    sg = (torch.randn(1, 2048, device="cuda") / 45).bfloat16()
    graph, r = captured(lambda: route(logits, 8, x=x, shared_gate_weight=sg, plan=True))
    for seed in (2, 3):
        logits.copy_(logits_hitting(T, 256, seed=seed))
        graph.replay()
        eager = route(logits, 8, x=x, shared_gate_weight=sg, plan=True)
        for a, b in ((r.ids, eager.ids), (r.weights, eager.weights), (r.tile_expert, eager.tile_expert), (r.tile_rows, eager.tile_rows)):
            assert torch.equal(a, b)


# --- the fused router GEMV + routing of decode (route_gemv, T <= 4) -----------------------------


def _route_gemv_case(T, E, H, dtype, seed):
    from ninfer_plugins.moe_triton.router import route_gemv

    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(T, H, generator=g, device=DEV).to(dtype)
    router = (torch.randn(E, H, generator=g, device=DEV) * 2 / H**0.5).to(dtype)
    sg = (torch.randn(1, H, generator=g, device=DEV) / H**0.5).to(dtype)
    lws = torch.full((4 * (E + 1) + 3,), float("nan"), device=DEV)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEV)
    mine = route_gemv(x, router, 3 if E < 64 else 8, sg, (lws, cnt))
    ref = route(torch.nn.functional.linear(x, router), mine.top_k, x=x, shared_gate_weight=sg)
    assert int(cnt[0]) == 0  # the last program left the counter as it found it
    return mine, ref


@interp
@pytest.mark.parametrize("T,E,H", [(1, 8, 64), (3, 13, 200), (4, 16, 128)])
def test_interpreted_route_gemv_equals_linear_then_route(T, E, H):
    mine, ref = _route_gemv_case(T, E, H, torch.float32, seed=T)
    assert torch.equal(mine.ids, ref.ids)
    torch.testing.assert_close(mine.weights, ref.weights, atol=1e-5, rtol=1e-5)


def _route_gemv_add_norm_case(T, E, H, dtype, seed):
    """route_gemv with the post-mixer residual add and norm in its launch, against cuda_fast's
    add_rms_norm kernel then route_gemv of its output."""
    from ninfer.kernels.triton.norms import rmsnorm
    from ninfer_plugins.moe_triton.router import route_gemv

    g = torch.Generator(device=DEV).manual_seed(seed)
    d = torch.randn(T, H, generator=g, device=DEV).to(dtype)
    res = (torch.randn(T, H, generator=g, device=DEV) * 3).to(dtype)
    nw = (torch.randn(H, generator=g, device=DEV) * 0.2).to(dtype)
    router = (torch.randn(E, H, generator=g, device=DEV) * 2 / H**0.5).to(dtype)
    sg = (torch.randn(1, H, generator=g, device=DEV) / H**0.5).to(dtype)
    lws = torch.full((4 * (E + 1) + 3,), float("nan"), device=DEV)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEV)
    res_ref = res.clone()
    h_ref = rmsnorm(d, nw, 1e-6, residual=res_ref)
    ref = route_gemv(h_ref, router, 3 if E < 64 else 8, sg, (lws, cnt))
    h = torch.full_like(d, float("nan"))
    mine = route_gemv(d, router, ref.top_k, sg, (lws, cnt), add_norm=(res, nw, 1e-6, h))
    assert int(cnt[0]) == 0
    return (mine, h, res), (ref, h_ref, res_ref)


@interp
@pytest.mark.parametrize("T,E,H", [(1, 8, 64), (3, 13, 200), (4, 16, 128)])
def test_interpreted_route_gemv_with_the_residual_add_and_norm(T, E, H):
    (mine, h, res), (ref, h_ref, res_ref) = _route_gemv_add_norm_case(T, E, H, torch.float32, seed=T + 10)
    assert torch.equal(res, res_ref)  # the residual stream: the same rounded sum, written once
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(mine.ids, ref.ids)
    torch.testing.assert_close(mine.weights, ref.weights, atol=1e-5, rtol=1e-5)


@interp
@pytest.mark.parametrize("add_norm", [False, True])
def test_interpreted_route_gemv_key_top_k_routes_as_the_reference(add_norm):
    """NINFER_ROUTE_TOPK=keys (route_gemv's topk_keys): the same experts as the linear then route,
    weights to a few ulps, with and without the add + norm; without a shared gate it is not
    taken (the key pick writes the shared slot)."""
    from ninfer.kernels.triton.norms import rmsnorm
    from ninfer_plugins.moe_triton.router import route_gemv

    T, E, H = 1, 16, 128
    g = torch.Generator(device=DEV).manual_seed(7)
    d = torch.randn(T, H, generator=g, device=DEV)
    res = torch.randn(T, H, generator=g, device=DEV) * 3
    nw = torch.randn(H, generator=g, device=DEV) * 0.2
    router = torch.randn(E, H, generator=g, device=DEV) * 2 / H**0.5
    sg = torch.randn(1, H, generator=g, device=DEV) / H**0.5
    lws = torch.full((4 * (E + 1) + 3,), float("nan"), device=DEV)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEV)
    h = rmsnorm(d, nw, 1e-6, residual=res.clone()) if add_norm else d
    ref = route(torch.nn.functional.linear(h, router), 4, x=h, shared_gate_weight=sg)
    fold = (res.clone(), nw, 1e-6, torch.empty_like(d)) if add_norm else None
    mine = route_gemv(d, router, 4, sg, (lws, cnt), add_norm=fold, topk_keys=True)
    assert torch.equal(mine.ids, ref.ids)
    torch.testing.assert_close(mine.weights, ref.weights, atol=1e-5, rtol=1e-5)
    assert int(cnt[0]) == 0
    plain = route_gemv(d, router, 4, None, (lws, cnt), topk_keys=True)
    if not add_norm:
        assert torch.equal(plain.ids, ref.ids[:, :4]) and plain.ids.shape == (T, 4)


@pytest.mark.gpu
@needs_cuda
def test_gpu_route_gemv_key_top_k_real_shapes():
    """The key pick at the 35B's shapes in bf16, with the add + norm, against the default pick in
    the same launch form: the same experts but where two logits tie to exp's rounding."""
    from ninfer_plugins.moe_triton.router import route_gemv

    E, H = 256, 2048
    for seed in range(4):
        g = torch.Generator(device=DEV).manual_seed(seed)
        d = torch.randn(1, H, generator=g, device=DEV).bfloat16()
        res = (torch.randn(1, H, generator=g, device=DEV) * 3).bfloat16()
        nw = (torch.randn(H, generator=g, device=DEV) * 0.2).bfloat16()
        router = (torch.randn(E, H, generator=g, device=DEV) * 2 / H**0.5).bfloat16()
        sg = (torch.randn(1, H, generator=g, device=DEV) / H**0.5).bfloat16()
        lws = torch.zeros(4 * (E + 1), device=DEV)
        cnt = torch.zeros(1, dtype=torch.int32, device=DEV)
        outs = []
        for keys in (False, True):
            r, h = res.clone(), torch.empty_like(d)
            outs.append((route_gemv(d, router, 8, sg, (lws, cnt), add_norm=(r, nw, 1e-6, h), topk_keys=keys), r, h))
        (a, ra, ha), (b, rb, hb) = outs
        assert torch.equal(ra, rb) and torch.equal(ha, hb)
        assert torch.equal(a.ids.sort(-1).values, b.ids.sort(-1).values)
        torch.testing.assert_close(a.weights.sort(-1).values, b.weights.sort(-1).values, atol=1e-6, rtol=1e-5)


@interp
def test_interpreted_route_gemv_add_norm_refuses_mismatched_buffers():
    from ninfer_plugins.moe_triton.router import route_gemv

    x = torch.zeros(1, 64)
    scratch = (torch.zeros(64), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="must be"):
        route_gemv(x, torch.zeros(8, 64), 2, None, scratch, add_norm=(torch.zeros(2, 64), torch.zeros(64), 1e-6, x))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [1, 4])
def test_gpu_route_gemv_with_the_residual_add_and_norm(T):
    for seed in range(3):
        (mine, h, res), (ref, h_ref, res_ref) = _route_gemv_add_norm_case(T, 256, 2048, torch.bfloat16, seed=seed)
        assert torch.equal(res, res_ref)
        # one warp's sum of squares against the norm kernel's: h may differ in a last bf16 bit
        torch.testing.assert_close(h.float(), h_ref.float(), atol=1e-2, rtol=1e-2)
        agree = (mine.ids.sort(-1).values == ref.ids.sort(-1).values).float().mean()
        assert float(agree) >= 0.95


@interp
def test_interpreted_route_gemv_refuses_five_tokens():
    from ninfer_plugins.moe_triton.router import route_gemv

    with pytest.raises(ValueError, match="at most 4"):
        route_gemv(torch.zeros(5, 64), torch.zeros(8, 64), 2, None, (torch.zeros(64), torch.zeros(1, dtype=torch.int32)))


@interp
def test_interpreted_route_gemv_warps_switch(monkeypatch):
    # NINFER_ROUTE_GEMV_WARPS (past one token): 1, 2 or 4, anything else refused by name
    from ninfer_plugins.moe_triton import router as R

    monkeypatch.delenv("NINFER_ROUTE_GEMV_WARPS", raising=False)
    assert R._gemv_warps(1) == R._gemv_warps(4) == 1
    monkeypatch.setenv("NINFER_ROUTE_GEMV_WARPS", "4")
    assert (R._gemv_warps(1), R._gemv_warps(2)) == (1, 4)
    monkeypatch.setenv("NINFER_ROUTE_GEMV_WARPS", "3")
    with pytest.raises(ValueError, match="NINFER_ROUTE_GEMV_WARPS"):
        R.route_gemv(torch.zeros(2, 64), torch.zeros(8, 64), 2, None, (torch.zeros(64), torch.zeros(1, dtype=torch.int32)))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T,warps", [(1, "1"), (2, "1"), (3, "1"), (4, "1"), (2, "4"), (4, "4"), (4, "2")])
def test_gpu_route_gemv_real_shapes(T, warps, monkeypatch):
    monkeypatch.setenv("NINFER_ROUTE_GEMV_WARPS", warps)  # past one token: the last program's warps
    for seed in range(4):
        mine, ref = _route_gemv_case(T, 256, 2048, torch.bfloat16, seed=seed)
        # the same bf16 logits up to the dot's summation order: the routing may differ only where
        # two experts tie to bf16 precision, so nearly every choice must agree
        agree = (mine.ids.sort(-1).values == ref.ids.sort(-1).values).float().mean()
        assert float(agree) >= 0.95
        same = (mine.ids == ref.ids).all(-1)
        torch.testing.assert_close(mine.weights[same], ref.weights[same], atol=2e-3, rtol=2e-2)
