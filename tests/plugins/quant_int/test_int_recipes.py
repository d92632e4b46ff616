"""`--quant int4` / `int8` recipes (spec 4.4) and the plugins' registration."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ninfer.device import probe
from ninfer.linear import DENSE
from ninfer.plugins import PluginManager

DENSE_27B = SimpleNamespace(num_experts=0, num_hidden_layers=64, hidden_size=5120)
MOE_35B = SimpleNamespace(num_experts=256, num_hidden_layers=40, hidden_size=2048)


@pytest.fixture(scope="module")
def pm():
    return PluginManager()


def recipe(pm, quant, shape, spec_id=None):
    spec = SimpleNamespace(id=spec_id) if spec_id else None
    return pm.hook.ninfer_quant_recipe(quant=quant, shape=shape, spec=spec)


def test_qwen36_27b_profile(pm):
    r = recipe(pm, "int4", DENSE_27B, "qwen3.6-27b").scheme_for
    assert r("lm_head", 248320, 5120) == "q6_g64" and r("embed_tokens", 248320, 5120) == "q6_g64"
    assert r("layers.3.self_attn.k_proj", 1024, 5120) == "q4_g64"
    assert r("layers.3.self_attn.q_proj", 12288, 5120) == "q5_g64"  # fused q | gate: the wider
    assert r("layers.3.self_attn.v_proj", 1024, 5120) == "q5_g64"
    assert r("layers.3.self_attn.o_proj", 5120, 6144) == "q5_g64"
    assert r("layers.0.linear_attn.in_proj_qkv", 10240, 5120) == "q5_g64"
    assert r("layers.0.linear_attn.in_proj_z", 6144, 5120) == "q5_g64"
    assert r("layers.0.linear_attn.out_proj", 5120, 6144) == "q5_g64"
    assert r("layers.0.linear_attn.in_proj_a", 48, 5120) == DENSE
    assert r("layers.0.linear_attn.in_proj_b", 48, 5120) == DENSE
    assert r("layers.0.mlp.gate_proj", 17408, 5120) == "q4_g64" and r("layers.0.mlp.up_proj", 17408, 5120) == "q4_g64"
    assert r("layers.0.mlp.down_proj", 5120, 17408) == "q5_g64"
    assert r("mtp.fc", 5120, 10240) == "q8_g32" and r("mtp.layers.0.mlp.gate_proj", 17408, 5120) == "q8_g32"


def test_qwen38_27b_embedding_and_head_q8(pm):
    r = recipe(pm, "int4", DENSE_27B, "qwen3.8-27b")
    assert r.scheme_for("lm_head", 248320, 5120) == "q8_g32" and r.scheme_for("embed_tokens", 248320, 5120) == "q8_g32"
    assert r.scheme_for("layers.0.mlp.gate_proj", 17408, 5120) == "q4_g64"


def test_qwen36_35b_a3b_profile(pm):
    r = recipe(pm, "int4", MOE_35B, "qwen3.6-35b-a3b").scheme_for
    assert r("embed_tokens", 248320, 2048) == "q8_g32" and r("lm_head", 248320, 2048) == "q6_g64"
    assert r("layers.3.self_attn.q_proj", 8192, 2048) == "q8_g32"
    assert r("layers.0.linear_attn.in_proj_qkv", 8192, 2048) == "q8_g32"
    assert r("layers.0.linear_attn.out_proj", 2048, 4096) == "q8_g32"
    assert r("layers.0.mlp.shared_expert.gate_proj", 512, 2048) == "q8_g32"
    assert r("layers.0.mlp.gate", 256, 2048) == DENSE
    assert r("layers.0.mlp.shared_expert_gate", 1, 2048) == DENSE
    assert r("layers.7.mlp.experts.5.gate_up_proj", 1024, 2048) == "q4_g64"
    assert r("layers.7.mlp.experts.5.down_proj", 2048, 512) == "q5_g64"
    for layer in (34, 38, 39):
        assert r(f"layers.{layer}.mlp.experts.0.down_proj", 2048, 512) == "q6_g64"
    assert r("mtp.layers.0.mlp.experts.3.down_proj", 2048, 512) == "q8_g32"


def test_unregistered_shapes_use_the_closest_profile(pm):
    tiny_dense = SimpleNamespace(num_experts=0, num_hidden_layers=8)
    tiny_moe = SimpleNamespace(num_experts=8, num_hidden_layers=4)
    assert recipe(pm, "int4", tiny_dense).scheme_for("lm_head", 1024, 256) == "q6_g64"
    r = recipe(pm, "int4", tiny_moe).scheme_for
    assert r("layers.0.mlp.experts.1.gate_up_proj", 128, 256) == "q4_g64"
    assert r("layers.3.mlp.experts.1.down_proj", 256, 64) == "q6_g64"  # L-1
    assert r("layers.1.self_attn.q_proj", 512, 256) == "q8_g32"


def test_int8_everywhere_and_nvfp4(pm):
    r = recipe(pm, "int8", DENSE_27B).scheme_for
    assert r("layers.0.mlp.gate_proj", 1, 1) == "q8_g32" and r("lm_head", 1, 1) == "q8_g32"
    assert r("layers.0.linear_attn.in_proj_b", 1, 1) == DENSE
    n = recipe(pm, "nvfp4", MOE_35B).scheme_for
    assert n("layers.0.mlp.experts.3.down_proj", 2048, 512) == "nvfp4"
    assert n("layers.0.mlp.gate", 256, 2048) == DENSE and n("lm_head", 248320, 2048) == "q8_g32"
    assert recipe(pm, "fp8", DENSE_27B) is None


def test_kernels_chosen_per_device(pm):
    cpu = probe("cpu")
    for scheme in ("q4_g64", "q5_g64", "q6_g64", "q8_g32", "nvfp4"):
        c = pm.choose("ninfer_linear_kernel", cpu, scheme=scheme, n=128, k=256)
        assert c.name == f"reference.{scheme}"
        assert any("needs cuda" in why for _, _, why in c.passed_over)
    schemes = {s.name: s for s in pm.collect("ninfer_quant_schemes")}
    assert schemes["q4_g64"].bits_per_weight == 4.25 and schemes["nvfp4"].bits_per_weight == 4.5
