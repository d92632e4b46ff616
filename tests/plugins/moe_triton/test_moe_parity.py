"""The MoE kernel through the model: the hook's choice, and the same logits from a tiny MoE
checkpoint through the Triton MoE (interpreted on the CPU) as through the reference layers.

CPU (CI): a throwaway plugin offers the Triton MoE for the CPU's float32 model (the way a tuned
kernel package wins: `tryfirst`); bf16 experts give the reference's logits to fp32 rounding, int4
experts (q4 gate_up, q6 down; bf16 activations inside the kernels) to within a few 1e-3.
GPU (`-m gpu`): one 35B-shaped MoE layer built by the family's own modules under `--quant int4`
(shared expert through quant_int's prepared layout), against the reference layer.
"""

from __future__ import annotations

import pytest
import torch
import moe_cases  # noqa: F401  (TRITON_INTERPRET=1 without CUDA, before any kernel loads)

from ninfer import hookimpl
from ninfer.device import ANYWHERE
from ninfer.kernels.triton.launch import interpreting
from ninfer.plugins import get_plugin_manager
from ninfer.testing import load_model, make_tiny
from ninfer_plugins.moe_triton.moe import TritonMoe

CUDA = torch.cuda.is_available()
interp = pytest.mark.skipif(not interpreting(), reason="interpreter tests run where there is no GPU (CI)")
needs_cuda = pytest.mark.skipif(not CUDA or interpreting(), reason="needs a CUDA device")
VOCAB = 64


class ForcedTritonMoe:
    """A throwaway plugin: the Triton MoE everywhere, for float32 activations too."""

    @hookimpl(tryfirst=True)
    def ninfer_moe_kernel(self, scheme_gate_up, scheme_down, device, num_experts, hidden, inner):
        return TritonMoe(requirements=ANYWHERE, fused_dtypes=(torch.float32, torch.bfloat16))


def _load_pair(path, **config):
    ref = load_model(path, **config)
    pm = get_plugin_manager()
    pm.register(ForcedTritonMoe(), name="forced_triton_moe")
    try:
        fast = load_model(path, **config)
    finally:
        pm.unregister("forced_triton_moe")
    return ref, fast


def _logits(model, prompt, decode_ids):
    """Prompt logits of slot 0, then one decode step of slots 0 and 1 (slot 1: a 2-token prompt)."""
    cache = model.allocate_cache(2, 32)
    first = model.compute_logits(model.forward(prompt, cache, 0, 0))
    model.forward(prompt[:2], cache, 1, 0)
    hidden = model.decode(decode_ids, cache, torch.tensor([0, 1]), torch.tensor([len(prompt), 2]))
    return first, model.compute_logits(hidden)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # two GDN layers: the MoE is what is under test, and each interpreted layer costs a second
    return make_tiny("qwen3.6-35b-a3b", tmp_path_factory.mktemp("tiny_moe"), vocab=VOCAB, layers=2)


@interp
def test_reference_is_chosen_on_the_cpu(tiny):
    model = load_model(tiny)
    bank = model.layers[0].mlp.experts
    assert bank.kernel.name == "torch.moe" and bank.moe_prepared is None
    choice = next(c for key, c in model.factory.choices.items() if key[0].startswith("moe["))
    assert ("moe_triton", "triton.moe", "needs cuda, this is cpu") in choice.passed_over


@interp
def test_bf16_experts_same_logits_interpreted(tiny):
    ref, fast = _load_pair(tiny)
    assert fast.layers[0].mlp.experts.kernel.name == "triton.moe"
    # 17 prompt tokens take the prefill path (sorted plan), the decode step the fused plan
    prompt = torch.randint(0, VOCAB, (17,), generator=torch.Generator().manual_seed(0))
    for a, b in zip(_logits(fast, prompt, torch.tensor([3, 9])), _logits(ref, prompt, torch.tensor([3, 9]))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@interp
def test_int4_experts_close_interpreted(tiny):
    ref, fast = _load_pair(tiny, quant="int4")
    assert fast.layers[0].mlp.experts.moe_prepared.gate_up.fmt == 4
    prompt = torch.randint(0, VOCAB, (3,), generator=torch.Generator().manual_seed(1))
    for a, b in zip(_logits(fast, prompt, torch.tensor([5, 1])), _logits(ref, prompt, torch.tensor([5, 1]))):
        # the kernels round activations and the SwiGLU output to bf16; the reference does not
        assert float((a - b).norm() / b.norm()) < 2e-2
        assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0)) > 0.999


@interp
def test_nvfp4_experts_close_interpreted(tiny):
    # quant_nvfp4's recipe: routed and shared experts NVFP4 (a global scale per expert), router bf16
    ref, fast = _load_pair(tiny, quant="nvfp4")
    w = fast.layers[0].mlp.experts.moe_prepared
    assert (w.gate_up.fmt, w.down.fmt) == (16, 16) and w.gate_up.g.shape == (16 * 2 * 32,)
    prompt = torch.randint(0, VOCAB, (3,), generator=torch.Generator().manual_seed(1))
    for a, b in zip(_logits(fast, prompt, torch.tensor([5, 1])), _logits(ref, prompt, torch.tensor([5, 1]))):
        assert float((a - b).norm() / b.norm()) < 2e-2
        assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0)) > 0.999


@interp
def test_expert_bank_seam_interpreted(tiny):
    ref, fast = _load_pair(tiny)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 64, generator=g)
    ids = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(6)])
    ids[0, :2] = torch.tensor([0, 15])
    w = torch.softmax(torch.randn(6, 4, generator=g), -1)
    torch.testing.assert_close(fast.layers[1].mlp.experts(x, ids, w), ref.layers[1].mlp.experts(x, ids, w), atol=1e-5, rtol=1e-5)


# --- GPU: one 35B layer through the family's modules -------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_gpu_35b_layer_int4_through_the_modules():
    from ninfer.device import probe
    from ninfer.linear import DENSE, LinearFactory, dense_weight
    from ninfer_plugins.moe_triton.router import route, route_reference
    from ninfer_plugins.qwen36_35b_a3b.plugin import SHAPE
    from ninfer_plugins.qwen_hybrid.layers import ReferenceMoe, SparseMoe
    from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape
    from ninfer_plugins.quant_int.recipes import recipe

    shape = QwenHybridShape(family="qwen_hybrid", **SHAPE)
    pm = get_plugin_manager()
    schemes = {s.name: s for s in pm.collect("ninfer_quant_schemes")}
    factory = LinearFactory(pm, probe("cuda"), recipe("int4", shape, None))
    moe = SparseMoe(shape, "layers.34.mlp", factory)  # a layer with q6 down
    assert moe.experts.kernel.name == "triton.moe"
    g = torch.Generator(device="cuda").manual_seed(0)

    def pack(linear, w):
        packed = dense_weight(w) if linear.scheme == DENSE else schemes[linear.scheme].quantize(w)
        linear.set_weight(packed)
        return packed

    def rand(*shp):
        return (torch.randn(*shp, generator=g, device="cuda") / shp[-1] ** 0.5).bfloat16()

    E, H, I = 256, 2048, 512
    moe.experts.load("gate_up", rand(E, 2 * I, H), pack)
    moe.experts.load("down", rand(E, H, I), pack)
    for linear in (moe.gate, moe.shared_expert_gate, moe.shared_expert.gate_proj, moe.shared_expert.up_proj, moe.shared_expert.down_proj):
        pack(linear, rand(linear.n, linear.k))
    w = moe.experts.moe_prepared
    assert (w.gate_up.fmt, w.down.fmt) == (4, 6)
    # the experts' QLinears read views of the stacks: the weights are held once (unless their
    # linear kernel keeps a layout of its own, and so no packed weight)
    first = moe.experts.gate_up[0].packed
    assert first is None or first.tensors["qweight"].data_ptr() == w.gate_up.q.data_ptr()
    from ninfer_plugins.moe_triton.moe import shared_weights

    for T in (1, 2, 4, 5, 16, 100):
        x = torch.randn(T, H, generator=g, device="cuda").bfloat16()
        # T = 1: the fused router; T <= 4 the pair kernels; past that the tiles
        fused = moe.experts.kernel._fused_router(moe, x, w, shared_weights(moe)) is not None
        assert fused == (T == 1)
        assert moe.experts.kernel.takes_pairs(T, w, shared_weights(moe)) == (T <= 4)
        out = moe(x)
        kernel, moe.experts.kernel = moe.experts.kernel, ReferenceMoe()
        try:
            ref = moe(x)
        finally:
            moe.experts.kernel = kernel
        # bf16 logits tie now and then; tokens whose top-k differs between torch.topk and the
        # kernel (lower id wins) are left out
        ids, _ = route_reference(moe.gate(x), moe.top_k)
        mine = route(moe.gate(x), moe.top_k).ids.long()
        same = (ids.sort(-1).values == mine.sort(-1).values).all(-1)
        assert int(same.sum()) >= T - max(1, T // 10)
        a, b = out[same].float(), ref[same].float()
        assert float((a - b).norm() / b.norm()) < 1.6e-2
