"""make_tiny writes the exact published layout, scaled down with the ratios that matter, and the
same bytes for the same seed; default_tiny_path builds the CLI's embedded default once."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open

from ninfer.errors import UserError
from ninfer.testing import default_tiny_path, make_tiny, reference_checkpoints_dir

REF = reference_checkpoints_dir()
LIKES = {
    "qwen3.6-27b": "Qwen__Qwen3.6-27B",
    "qwen3.8-27b": "Qwen__Qwen3.8-27B",
    "qwen3.6-35b-a3b": "Qwen__Qwen3.6-35B-A3B",
}


def _tensors(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


@pytest.fixture(scope="module")
def tinies(tmp_path_factory):
    return {like: make_tiny(like, tmp_path_factory.mktemp(like), vocab=128) for like in LIKES}


@pytest.mark.parametrize("like", list(LIKES))
def test_names_are_the_published_names(tinies, like):
    if REF is None:
        pytest.skip("../shared/reference/checkpoints is absent")
    cfg = json.loads((tinies[like] / "config.json").read_text())
    layers = cfg["text_config"]["num_hidden_layers"]
    published = (REF / LIKES[like] / "weight_map_keys.DERIVED.txt").read_text().split()

    def kept(name):
        m = re.match(r"model\.language_model\.layers\.(\d+)\.", name)
        m = m or re.match(r"model\.visual\.blocks\.(\d+)\.", name)
        limit = layers if name.startswith("model.language_model") else 1
        return m is None or int(m.group(1)) < limit

    assert sorted(_tensors(tinies[like])) == sorted(n for n in published if kept(n))


@pytest.mark.parametrize("like", list(LIKES))
def test_config_keeps_field_set_and_ratios(tinies, like):
    from ninfer_plugins.qwen_hybrid.shape import parse_hf_config

    cfg = json.loads((tinies[like] / "config.json").read_text())
    if REF is not None:
        real = json.loads((REF / LIKES[like] / "config.json").read_text())
        assert list(cfg) == list(real) and list(cfg["text_config"]) == list(real["text_config"])
        assert (cfg["model_type"], cfg["architectures"]) == (real["model_type"], real["architectures"])
    s = parse_hf_config(cfg)
    moe = like.endswith("a3b")
    assert s.num_attention_heads // s.num_key_value_heads == (8 if moe else 6)
    assert s.linear_num_value_heads // s.linear_num_key_heads == (2 if moe else 3)
    assert s.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert s.rotary_dim == s.head_dim // 4 and sum(s.mrope_section) == s.rotary_dim // 2
    assert s.vocab_size == 128 and s.mtp_num_hidden_layers == 1


def test_norms_are_not_identity(tinies):
    t = _tensors(tinies["qwen3.6-27b"])
    offset = [v for k, v in t.items() if k.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight"))]
    assert all(v.float().abs().mean() > 0.05 for v in offset)
    gdn = t["model.language_model.layers.0.linear_attn.norm.weight"].float()
    assert (gdn - 1).abs().mean() > 0.05
    a_log = t["model.language_model.layers.0.linear_attn.A_log"].float()
    assert a_log.min() > -4 and a_log.max() < 1


def test_same_seed_same_bytes(tmp_path):
    a = make_tiny("qwen3.6-35b-a3b", tmp_path / "a", seed=3, vocab=64, shards=2)
    b = make_tiny("qwen3.6-35b-a3b", tmp_path / "b", seed=3, vocab=64, shards=2)
    c = make_tiny("qwen3.6-35b-a3b", tmp_path / "c", seed=4, vocab=64, shards=2)
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    first = "model-00001-of-00002.safetensors"
    assert (a / first).read_bytes() != (c / first).read_bytes()


def test_per_expert_layout_holds_the_same_weights(tmp_path):
    fused = _tensors(make_tiny("qwen3.6-35b-a3b", tmp_path / "f", vocab=64))
    split = _tensors(make_tiny("qwen3.6-35b-a3b", tmp_path / "p", vocab=64, expert_layout="per_expert"))
    p = "mtp.layers.0.mlp.experts."
    assert p + "gate_up_proj" in fused and p + "0.gate_proj.weight" not in fused
    assert p + "gate_up_proj" not in split
    gate_up = fused["model.language_model.layers.1.mlp.experts.gate_up_proj"]
    e5 = "model.language_model.layers.1.mlp.experts.5."
    assert torch.equal(torch.cat([split[e5 + "gate_proj.weight"], split[e5 + "up_proj.weight"]]), gate_up[5])
    assert torch.equal(split[e5 + "down_proj.weight"], fused["model.language_model.layers.1.mlp.experts.down_proj"][5])


def test_sidecars_copied(tinies):
    generation = json.loads((tinies["qwen3.6-27b"] / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [248046, 248044]
    if REF is not None:
        real = (REF / "Qwen__Qwen3.6-27B" / "chat_template.jinja").read_bytes()
        assert (tinies["qwen3.6-27b"] / "chat_template.jinja").read_bytes() == real
    assert not (tinies["qwen3.6-27b"] / "tokenizer.json").exists()


def test_bad_arguments(tmp_path):
    with pytest.raises(UserError, match="qwen3.6-27b"):
        make_tiny("llama-7b", tmp_path)
    with pytest.raises(UserError, match="--vocab"):
        make_tiny("qwen3.6-27b", tmp_path, vocab=3)
    with pytest.raises(UserError, match="per_expert"):
        make_tiny("qwen3.6-27b", tmp_path, expert_layout="interleaved")


def test_default_tiny_built_once_and_accepts_real_token_ids(tmp_path, monkeypatch):
    from ninfer.testing import greedy_generate, load_model

    monkeypatch.setenv("NINFER_CACHE", str(tmp_path))
    path = default_tiny_path()
    assert path == tmp_path / "tiny-qwen3.6-27b"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert default_tiny_path() == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tiny")]  # no temp dirs left
    model = load_model(path)
    assert model.shape.vocab_size == 248320
    out = greedy_generate(model, [248045, 846, 248076], 2)
    assert len(out) == 2 and all(0 <= t < 248320 for t in out)
