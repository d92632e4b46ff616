"""After loading, dense projections that share an input run as one GEMV (merge_dense): the
model's numbers do not change, the weights are held once, and a step launches fewer kernels."""

from __future__ import annotations

import torch

from ninfer.linear import QLinear
from ninfer.testing import greedy_generate, load_model, make_tiny


def test_merged_projections_change_nothing(tmp_path, monkeypatch):
    from ninfer_plugins.qwen_hybrid.layers import GatedAttention, GatedDeltaNet, SwiGLU
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    path = make_tiny("qwen3.6-27b", tmp_path / "tiny", seed=5)
    merged = load_model(path, dtype="float32")
    with monkeypatch.context() as m:
        m.setattr(QwenHybridModel, "fuse_linears", lambda self: None)
        plain = load_model(path, dtype="float32")
    mlps = [x for x in merged.modules() if isinstance(x, SwiGLU)]
    gdns = [x for x in merged.modules() if isinstance(x, GatedDeltaNet)]
    assert mlps and all(x.gate_up is not None for x in mlps)
    # fp32: every GDN input projection is dense, so all four merge
    assert gdns and all(x.in_proj_all is not None for x in gdns)
    attns = [x for x in merged.modules() if isinstance(x, GatedAttention)]
    assert attns and all(x.qkv_proj is not None for x in attns)
    # held once: the parts are views of the merged weight, and the merged linears are not modules
    mlp = mlps[0]
    assert mlp.gate_proj.prepared.data_ptr() == mlp.gate_up.prepared.data_ptr()
    names = {x.name for x in merged.modules() if isinstance(x, QLinear)}
    assert names == {x.name for x in plain.modules() if isinstance(x, QLinear)}
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    with torch.no_grad():
        a = merged.compute_logits(merged.forward(ids, merged.allocate_cache(1, 16, "bf16"), 0, 0))
        b = plain.compute_logits(plain.forward(ids, plain.allocate_cache(1, 16, "bf16"), 0, 0))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert greedy_generate(merged, ids, 12) == greedy_generate(plain, ids, 12)


def test_int4_keeps_quantized_parts_apart(tmp_path):
    from ninfer_plugins.qwen_hybrid.layers import GatedDeltaNet, SwiGLU

    model = load_model(make_tiny("qwen3.6-27b", tmp_path / "tiny", seed=5), quant="int4", dtype="float32")
    # gate/up are q4: not merged (a merged quantized shape has no tuned kernel config)
    assert all(x.gate_up is None for x in model.modules() if isinstance(x, SwiGLU))
    # a and b stay dense in every recipe: those two merge
    gdns = [x for x in model.modules() if isinstance(x, GatedDeltaNet)]
    assert all(x.in_proj_all is None and x.in_proj_ab is not None for x in gdns)
