"""The fast path's backends inside the model: the same tiny checkpoint through the fused steps
(Triton prep + split-K decode + flash prefill, fused GDN step, Triton norms) and through the torch
reference. On CPU the kernels run interpreted (small shapes); `-m gpu` runs them for real."""

from __future__ import annotations

import pytest
import torch

from ninfer.checkpoint import WeightSource, load_hf_config
from ninfer.device import probe
from ninfer.linear import LinearFactory
from ninfer.plugins import get_plugin_manager
from ninfer.testing import make_tiny
from ninfer_plugins.cuda_fast.attention import FlashFullAttention, _masked_prefill, prefill_attention
from ninfer_plugins.cuda_fast.gdn import TritonLinearAttention
from ninfer_plugins.cuda_fast.ops import silu_mul
from ninfer_plugins.qwen_hybrid.attention import ReferenceFullAttention
from ninfer_plugins.qwen_hybrid.gdn import ReferenceLinearAttention
from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

VOCAB = 256
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("tiny27"), vocab=VOCAB, layers=4)


def _model(path, device, dtype, fast: bool):
    pm = get_plugin_manager()
    shape = pm.hook.ninfer_parse_config(hf_config=load_hf_config(path))
    full, linear = (FlashFullAttention(), TritonLinearAttention()) if fast else (ReferenceFullAttention(), ReferenceLinearAttention())
    m = QwenHybridModel(shape, LinearFactory(pm, probe(device), None), torch.device(device), dtype, full, linear)
    m.load_weights(WeightSource(path))
    return m


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def _run(model, kv_dtype, ids, prefill_lens):
    """Prefill slot 1 in chunks of the given lengths (first at 0: flash causal; later ones: the
    log-sum-exp merge with the cached prefix, or the split-K kernel when short), slot 0 with a
    short prompt, then two decode steps over both slots. Logits of every stage."""
    cache = model.allocate_cache(2, 64, kv_dtype)
    outs, start = [], 0
    for n in prefill_lens:
        outs.append(model.compute_logits(model.forward(ids[start : start + n], cache, 1, start)))
        start += n
    outs.append(model.compute_logits(model.forward(ids[:5], cache, 0, 0)))
    dev = model.device
    positions = torch.tensor([5, start], device=dev)
    for step in range(2):
        h = model.decode(torch.tensor([7 + step, 9 + step], device=dev), cache, torch.tensor([0, 1], device=dev), positions + step)
        outs.append(model.compute_logits(h))
    return outs


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_fused_bf16_matches_reference(tiny, kv_dtype):
    device = "cuda" if CUDA else "cpu"
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1)).to(device)
    lens = (12, 10, 3) if not CUDA else (20, 14, 3, 1)
    oracle = _run(_model(tiny, "cpu", torch.float32, fast=False), kv_dtype, ids.cpu(), lens)
    fast_model = _model(tiny, device, torch.bfloat16, fast=True)
    assert fast_model.graph_decode and fast_model.ops.name == "triton"
    fast = _run(fast_model, kv_dtype, ids, lens)
    ref = _run(_model(tiny, "cpu", torch.bfloat16, fast=False), kv_dtype, ids.cpu(), lens)
    for got, want, ref_bf16 in zip(fast, oracle, ref):
        # the fused bf16 path is about as close to the fp32 oracle as the reference's own bf16
        # run is (0.01-0.04 here), and picks the same argmax wherever the oracle's top two are
        # not near a tie (random tiny weights have some)
        got = got.cpu()
        assert _rel(got, want) < max(0.08, 3 * _rel(ref_bf16, want))
        top2 = want.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.05 * want.abs().max()
        assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_fp32_model_keeps_the_reference_cores(tiny):
    m = _model(tiny, "cpu", torch.float32, fast=True)
    assert not m.graph_decode and m.ops.name == "torch"
    ref = _model(tiny, "cpu", torch.float32, fast=False)
    ids = torch.randint(0, VOCAB, (16,), generator=torch.Generator().manual_seed(2))
    a = _run(m, "bf16", ids, (16,))
    b = _run(ref, "bf16", ids, (16,))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("start", [0, 7, 33])
def test_prefill_attention_merges_prefix_and_chunk(start):
    gen = torch.Generator().manual_seed(start)
    t_len, hq, hkv, d = 11, 12, 2, 64
    q = torch.randn(t_len, hq, d, generator=gen)
    k = torch.randn(start + t_len, hkv, d, generator=gen)
    v = torch.randn(start + t_len, hkv, d, generator=gen)
    want = _masked_prefill(q.double(), k.double(), v.double(), start, 0.125)
    torch.testing.assert_close(prefill_attention(q, k, v, start, 0.125).double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prefill_attention(q, k, v, start, 0.125, merge=False).double(), want, atol=1e-5, rtol=1e-5)


def test_silu_mul():
    device = "cuda" if CUDA else "cpu"
    g = torch.randn(3, 700, device=device).to(torch.bfloat16)
    u = torch.randn(3, 700, device=device).to(torch.bfloat16)
    want = torch.nn.functional.silu(g.float()) * u.float()
    torch.testing.assert_close(silu_mul(g, u).float(), want, atol=1e-2, rtol=1e-2)
    # the two halves of a merged gate|up output: strided rows, read in place, same values
    gu = torch.cat([g, u], dim=-1)
    gate, up = gu.split(700, dim=-1)
    assert not gate.is_contiguous()
    assert torch.equal(silu_mul(gate, up), silu_mul(g, u))


def test_backends_need_cuda():
    pm = get_plugin_manager()
    cpu = probe("cpu")
    for kind, head_dim in (("full", 256), ("linear", 128)):
        choice = pm.choose("ninfer_attention_backend", cpu, kind=kind, kv_dtype="int8", head_dim=head_dim)
        assert not choice.name.startswith("cuda_fast")
        assert any(p == "cuda_fast" and "needs cuda" in why for p, _, why in choice.passed_over)
    assert pm.hook.ninfer_attention_backend(kind="full", device=cpu, kv_dtype="fp8", head_dim=256) is not None  # the reference
    from ninfer_plugins.cuda_fast.plugin import ninfer_attention_backend

    assert ninfer_attention_backend("full", cpu, "fp8", 256) is None
    assert ninfer_attention_backend("full", cpu, "bf16", 96) is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_fla_prefill_matches_torch_chunked():
    from ninfer_plugins.qwen_hybrid.gdn import chunked_gated_delta_rule

    gen = torch.Generator(device="cuda").manual_seed(0)
    t_len, hk, hv, d = 300, 4, 12, 128
    q = torch.nn.functional.normalize(torch.randn(t_len, hk, d, generator=gen, device="cuda"), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(t_len, hk, d, generator=gen, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(t_len, hv, d, generator=gen, device="cuda").bfloat16()
    g = -torch.rand(t_len, hv, generator=gen, device="cuda")
    beta = torch.rand(t_len, hv, generator=gen, device="cuda")
    s0 = torch.randn(hv, d, d, generator=gen, device="cuda") * 0.1
    backend = TritonLinearAttention()
    o, s = backend.prefill(q, k, v, g, beta, s0, d**-0.5)
    assert backend._fla is not None, "fla-core is installed on the device: its kernel should serve"
    o_ref, s_ref = chunked_gated_delta_rule(q, k, v, g, beta, s0, d**-0.5)
    assert _rel(o, o_ref) < 2e-2 and _rel(s, s_ref) < 2e-2


def test_gates_inside_the_gdn_step_match_their_own_launch(tiny, monkeypatch):
    """By default (NINFER_GDN_AB unset), with int4 projections (a and b stay dense, merged apart
    from qkv/z), the fused decode step computes in_proj_a / in_proj_b itself; the logits match
    the path that launches them, NINFER_GDN_AB=0 (the gates then stay fp32 instead of rounding to
    bf16: close, not equal)."""
    from ninfer_plugins.qwen_hybrid.layers import GatedDeltaNet
    from ninfer_plugins.quant_int.recipes import recipe

    device = "cuda" if CUDA else "cpu"
    pm = get_plugin_manager()
    shape = pm.hook.ninfer_parse_config(hf_config=load_hf_config(tiny))
    schemes = {s.name: s for s in pm.collect("ninfer_quant_schemes")}
    m = QwenHybridModel(shape, LinearFactory(pm, probe(device), recipe("int4", shape, None)), torch.device(device),
                        torch.bfloat16, FlashFullAttention(), TritonLinearAttention(), quant_schemes=schemes)
    m.load_weights(WeightSource(tiny))
    gdn = [mod for mod in m.modules() if isinstance(mod, GatedDeltaNet)]
    x = torch.zeros(1, shape.hidden_size, dtype=torch.bfloat16, device=device)
    monkeypatch.delenv("NINFER_GDN_AB", raising=False)
    assert gdn and all(g._ab_in_step(x) is not None for g in gdn)  # on by default
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(3)).to(device)
    monkeypatch.setenv("NINFER_GDN_AB", "0")
    assert all(g._ab_in_step(x) is None for g in gdn)
    launched = _run(m, "bf16", ids, (12,))
    monkeypatch.delenv("NINFER_GDN_AB")
    inside = _run(m, "bf16", ids, (12,))
    for got, want in zip(inside[2:], launched[2:]):  # the decode steps (prefill is unchanged)
        assert _rel(got, want) < 0.03


def test_state_read_before_the_wait_changes_no_bit(tiny, monkeypatch):
    """NINFER_GDN_EARLY=1: each GDN layer's projections launch inside the backend's
    decode_inputs_scope (launch.late_dependents) and the step reads its slot ids and state before
    its PDL wait. The arithmetic is the same, so the logits are equal to the bit; every decode
    step's GDN layers take that path (spied)."""
    import ninfer.kernels.triton.gdn as G

    device = "cuda" if CUDA else "cpu"
    m = _model(tiny, device, torch.bfloat16, fast=True)
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(4)).to(device)
    monkeypatch.setenv("NINFER_GDN_EARLY", "0")
    plain = _run(m, "bf16", ids, (12,))
    seen = []
    real = G.gdn_decode_step

    def spy(*args, **kwargs):
        seen.append(kwargs.get("state_early", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(G, "gdn_decode_step", spy)
    monkeypatch.setattr("ninfer.kernels.triton.gdn_decode_step", spy)
    monkeypatch.setenv("NINFER_GDN_EARLY", "1")
    early = _run(m, "bf16", ids, (12,))
    gdn_layers = sum(1 for t in m.shape.layer_types if t != "full_attention")
    assert seen == [True] * (2 * gdn_layers)  # two decode steps
    for got, want in zip(early, plain):
        assert torch.equal(got, want)


def test_each_norm_offers_itself_to_the_linear_that_reads_it_first(tiny, monkeypatch):
    """The layer loop hands each norm the QLinear that reads its output first (ops' `into`): the
    next mixer's first projection, the MLP's gate|up, the head after the last layer. Its kernel
    may make the norm (QLinear.norm_input: quant_int's K-walk x pairs, NINFER_KW_XREUSE=1); here
    every kernel declines, and the order of the offers is checked on a decode step."""
    from ninfer.linear import QLinear

    device = "cuda" if CUDA else "cpu"
    m = _model(tiny, device, torch.bfloat16, fast=True)
    assert m.ops.name == "triton"
    offered = []
    monkeypatch.setattr(QLinear, "norm_input", lambda self, *a, **k: offered.append(self.name))
    cache = m.allocate_cache(1, 32)
    m.forward(torch.tensor([1, 2, 3], device=device), cache, 0, 0)
    offered.clear()
    m.decode(torch.tensor([4], device=device), cache, torch.tensor([0], device=device), torch.tensor([3], device=device))
    want = []
    for layer in m.layers:
        want += [layer.mixer.input_linear.name, layer.mlp.input_linear.name]
    if m.lm_head is not None:
        want.append(m.lm_head.name)
    assert offered == want


def test_the_linear_offered_a_norm_is_the_next_one_called(tiny, monkeypatch):
    """Not circular: each norm's offer (QLinear.norm_input) is followed, among the QLinear calls,
    by a call of that same linear first (the head's after compute_logits)."""
    from ninfer.linear import QLinear

    device = "cuda" if CUDA else "cpu"
    m = _model(tiny, device, torch.bfloat16, fast=True)
    events = []
    forward = QLinear.forward

    def spy(self, x, *args, **kwargs):
        events.append(("call", self.name))
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(QLinear, "forward", spy)
    monkeypatch.setattr(QLinear, "norm_input", lambda self, *a, **k: events.append(("offer", self.name)))
    cache = m.allocate_cache(1, 32)
    m.forward(torch.tensor([1, 2, 3], device=device), cache, 0, 0)
    events.clear()
    h = m.decode(torch.tensor([4], device=device), cache, torch.tensor([0], device=device), torch.tensor([3], device=device))
    m.compute_logits(h)
    offers = [i for i, e in enumerate(events) if e[0] == "offer"]
    assert offers
    for i in offers:
        nxt = next((e for e in events[i + 1:] if e[0] == "call"), None)
        assert nxt is not None and nxt[1] == events[i][1], (events[i], nxt)


def test_model_lets_a_moe_layer_fold_its_residual_add_and_norm(tmp_path, monkeypatch):
    """The layer loop's contract with `forward_add_norm`: given (delta, residual, weight, eps) the
    MoE updates the residual in place and returns its output; here a stand-in that does exactly
    what the loop would, so the logits must not change by a bit."""
    from ninfer.kernels.triton.norms import rmsnorm
    from ninfer_plugins.qwen_hybrid.layers import SparseMoe

    path = make_tiny("qwen3.6-35b-a3b", tmp_path / "tiny35", vocab=VOCAB, layers=4)
    device = "cuda" if CUDA else "cpu"
    m = _model(path, device, torch.bfloat16, fast=True)
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(4)).to(device)
    plain = _run(m, "bf16", ids, (9,))
    calls = []

    def fold(self, delta, residual, weight, eps):
        calls.append(delta.shape[0])
        return self(rmsnorm(delta, weight, eps, residual=residual))

    monkeypatch.setattr(SparseMoe, "forward_add_norm", fold)
    folded = _run(m, "bf16", ids, (9,))
    assert calls and m.ops.name == "triton"
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)


@pytest.mark.parametrize("like", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_model_lets_the_last_linear_fold_the_residual_add_and_norm(tmp_path, monkeypatch, like):
    """NINFER_GEMV_NORM=1: the decode loop hands o_proj / out_proj and the dense MLP's down_proj an
    AddNorm (ninfer.linear); here a stand-in kernel fold that does what the loop would, so the
    logits must not change by a bit, and every such linear must have been offered it."""
    from ninfer.kernels.triton.norms import rmsnorm
    from ninfer.linear import QLinear

    path = make_tiny(like, tmp_path / like, vocab=VOCAB, layers=4)
    device = "cuda" if CUDA else "cpu"
    m = _model(path, device, torch.bfloat16, fast=True)
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(5)).to(device)
    plain = _run(m, "bf16", ids, (9,))
    folded_by, orig = [], QLinear.forward

    def forward(self, x, add_norm=None):
        y = orig(self, x)
        if add_norm is not None and add_norm.out is None:
            add_norm.out = rmsnorm(y, add_norm.weight, add_norm.eps, residual=add_norm.residual)
            folded_by.append(self.name.rsplit(".", 1)[-1])
        return y

    monkeypatch.setattr(QLinear, "forward", forward)
    monkeypatch.setenv("NINFER_GEMV_NORM", "1")
    folded = _run(m, "bf16", ids, (9,))
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)
    # two decode steps over 4 layers (3 GDN + 1 attention), prefill untouched
    want = {"out_proj", "o_proj"} | ({"down_proj"} if like == "qwen3.6-27b" else set())
    assert set(folded_by) == want
    assert len(folded_by) == 2 * 4 * (2 if like == "qwen3.6-27b" else 1)


def test_dense_mlp_lets_down_proj_take_the_activation(tiny):
    """SwiGLU offers down_proj the merged gate | up output (QLinear.forward_gated) before running
    silu_mul; here a stand-in kernel fold that does what the MLP would, so the logits must not
    change by a bit and every MLP call (prefill and decode) must have offered it. Without a kernel
    that folds (bf16's torch.linear), forward_gated is None and the MLP runs as before."""
    from ninfer.linear import QLinear

    device = "cuda" if CUDA else "cpu"
    m = _model(tiny, device, torch.bfloat16, fast=True)
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(6)).to(device)
    downs = [mod for name, mod in m.named_modules() if name.endswith("mlp.down_proj")]
    assert downs and all(d.forward_gated(torch.zeros(1, 2 * d.k, device=device, dtype=torch.bfloat16)) is None
                         for d in downs)
    plain = _run(m, "bf16", ids, (9,))
    calls = []

    def forward_gated(self, gu):
        calls.append(gu.shape[0])
        return self(m.ops.silu_mul(gu[..., : self.k], gu[..., self.k :]))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(QLinear, "forward_gated", forward_gated)
        folded = _run(m, "bf16", ids, (9,))
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)
    # 4 layers x (prefill of 9, prefill of 5, two decode steps)
    assert sorted(calls) == sorted([9] * 4 + [5] * 4 + [2] * 8)
