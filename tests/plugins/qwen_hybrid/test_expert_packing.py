"""A bank's experts quantized in one call are bit-identical to packing them one by one, and the
MoE kernel's stack takes them without a copy."""

from __future__ import annotations

import torch

from ninfer.testing import load_model, make_tiny
from ninfer_plugins.quant_int import formats as F


def test_model_loads_the_same_bits_either_way(tmp_path, monkeypatch):
    """A tiny int4 MoE checkpoint loaded with the one-call bank packing and with the per-expert
    path: every expert's packed tensors are equal, and so are the logits."""
    from ninfer.linear import QLinear
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    path = make_tiny("qwen3.6-35b-a3b", tmp_path / "tiny_moe", seed=3)
    batched = load_model(path, quant="int4", dtype="float32")
    with monkeypatch.context() as m:
        m.setattr(QwenHybridModel, "_pack_experts", lambda self, linears, stacked: None)
        single = load_model(path, quant="int4", dtype="float32")
    la = {x.name: x for x in batched.modules() if isinstance(x, QLinear) and ".experts." in x.name}
    lb = {x.name: x for x in single.modules() if isinstance(x, QLinear) and ".experts." in x.name}
    assert la and la.keys() == lb.keys()
    quantized = 0
    for name, x in la.items():
        y = lb[name]
        assert x.scheme == y.scheme, name
        if x.packed is None or y.packed is None:
            continue
        quantized += x.scheme in F.FORMATS
        for part, t in x.packed.tensors.items():
            assert torch.equal(t, y.packed.tensors[part]), (name, part)
    assert quantized
    # and the first model really took the one-call path: its experts are row slices of one stack
    q = next(x.packed.tensors["qweight"] for x in la.values() if x.packed is not None and x.scheme in F.FORMATS)
    assert q._base is not None and q._base.shape[0] > q.shape[0]
    ids = torch.tensor([1, 5, 9, 2, 7])
    assert torch.equal(_logits(batched, ids), _logits(single, ids))


def _logits(model, ids):
    with torch.no_grad():
        cache = model.allocate_cache(1, 32, "bf16")
        return model.compute_logits(model.forward(ids, cache, 0, 0))


def test_one_call_and_per_expert_encodes_agree():
    from ninfer.linear import PackedWeight, QLinear
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    g = torch.Generator().manual_seed(0)
    E, n, k = 5, 48, 200
    stacked = torch.randn(E, n, k, generator=g)
    for scheme in ("q4_g64", "q5_g64", "q6_g64", "q8_g32"):
        class _K:
            name, repacks = "k", False

            def prepare(self, w):
                return w

        linears = [QLinear(f"e{e}", n, k, scheme, _K()) for e in range(E)]
        fake = type("M", (), {})()
        fake.device, fake.dtype = torch.device("cpu"), torch.float32
        fake.EXPERT_CHUNK_WEIGHTS = 2 * n * k  # several chunks, one of them short
        from ninfer.plugins import get_plugin_manager

        fake.quant_schemes = {s.name: s for s in get_plugin_manager().collect("ninfer_quant_schemes")}
        packed = QwenHybridModel._pack_experts(fake, linears, stacked)
        assert packed is not None and len(packed) == E
        for e in range(E):
            one = F.quantize(stacked[e], scheme)
            for name, t in one.tensors.items():
                assert torch.equal(packed[e].tensors[name], t), (scheme, e, name)
            assert linears[e].packed is packed[e]
            assert isinstance(packed[e], PackedWeight)

        from ninfer_plugins.moe_triton.moe import _row_stack, stack_experts

        m = stack_experts(packed)
        # no copy: the grouped kernel's matrix is the loader's stack
        assert m.q.data_ptr() == packed[0].tensors["qweight"].data_ptr()
        assert _row_stack([packed[1].tensors["scales"], packed[0].tensors["scales"]]) is None
