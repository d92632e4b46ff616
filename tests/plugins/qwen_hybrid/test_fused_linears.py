"""After loading, projections that share an input run as one GEMV (merge_rows): the
model's numbers do not change, the weights are held once, and a step launches fewer kernels."""

from __future__ import annotations

import torch

from ninfer.linear import QLinear
from ninfer.testing import greedy_generate, load_model, make_tiny


def _merged_and_plain(path, monkeypatch, **config):
    """The checkpoint loaded as the engine does (projections merged) and with fuse_linears off."""
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    merged = load_model(path, dtype="float32", **config)
    with monkeypatch.context() as m:
        m.setattr(QwenHybridModel, "fuse_linears", lambda self: None)
        plain = load_model(path, dtype="float32", **config)
    return merged, plain


def _assert_same_numbers(merged, plain):
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    with torch.no_grad():
        a = merged.compute_logits(merged.forward(ids, merged.allocate_cache(1, 16, "bf16"), 0, 0))
        b = plain.compute_logits(plain.forward(ids, plain.allocate_cache(1, 16, "bf16"), 0, 0))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert greedy_generate(merged, ids, 12) == greedy_generate(plain, ids, 12)


def test_merged_projections_change_nothing(tmp_path, monkeypatch):
    from ninfer_plugins.qwen_hybrid.layers import GatedAttention, GatedDeltaNet, SwiGLU

    merged, plain = _merged_and_plain(make_tiny("qwen3.6-27b", tmp_path / "tiny", seed=5), monkeypatch)
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
    _assert_same_numbers(merged, plain)


def test_quantized_projections_of_one_scheme_merge_too(tmp_path, monkeypatch):
    """--quant int4: gate+up (q4), a GDN layer's qkv+z (q5) and an attention layer's q+v (q5, k
    being q4) merge by rows like dense ones; a and b (dense) merge apart; the numbers do not move."""
    from ninfer_plugins.qwen_hybrid.layers import GatedAttention, GatedDeltaNet, SwiGLU

    merged, plain = _merged_and_plain(make_tiny("qwen3.6-27b", tmp_path / "tiny", seed=6), monkeypatch, quant="int4")
    mlps = [x for x in merged.modules() if isinstance(x, SwiGLU)]
    gdns = [x for x in merged.modules() if isinstance(x, GatedDeltaNet)]
    attns = [x for x in merged.modules() if isinstance(x, GatedAttention)]
    assert mlps and all(x.gate_up is not None and x.gate_up.scheme == "q4_g64" for x in mlps)
    assert gdns and all(x.in_proj_all is None and x.in_proj_qkvz.scheme == "q5_g64" and x.in_proj_ab is not None for x in gdns)
    assert attns and all(x.qkv_proj is None and x.qv_proj.scheme == "q5_g64" for x in attns)
    g = gdns[0]
    assert g.in_proj_z.prepared.data_ptr() != g.in_proj_qkv.prepared.data_ptr()
    assert g.in_proj_qkvz.prepared.data_ptr() == g.in_proj_qkv.prepared.data_ptr()
    _assert_same_numbers(merged, plain)
