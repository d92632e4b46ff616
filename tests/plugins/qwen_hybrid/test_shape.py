"""config.json parsing: the published files as they are, transformers' own saves, and the
registered specs (exact shapes, parameter counts, memory figures)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ninfer.checkpoint import match_spec
from ninfer.errors import CheckpointError
from ninfer.plugins import get_plugin_manager
from ninfer.testing import reference_checkpoints_dir
from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape, parse_hf_config

REF = reference_checkpoints_dir()
PUBLISHED = {
    "qwen3.6-27b": "Qwen__Qwen3.6-27B",
    "qwen3.8-27b": "Qwen__Qwen3.8-27B",
    "qwen3.6-35b-a3b": "Qwen__Qwen3.6-35B-A3B",
}
PLUGIN_DIRS = {"qwen3.6-27b": "qwen36_27b", "qwen3.8-27b": "qwen38_27b", "qwen3.6-35b-a3b": "qwen36_35b_a3b"}
PLUGINS = Path(__file__).resolve().parents[3] / "plugins"


def _specs():
    return get_plugin_manager().collect("ninfer_checkpoints")


def _published(cid: str) -> dict:
    if REF is None:
        pytest.skip("../shared/reference/checkpoints is absent: the published configs cannot be read")
    return json.loads((REF / PUBLISHED[cid] / "config.json").read_text())


@pytest.mark.parametrize("cid", list(PUBLISHED))
def test_published_config_parses_and_matches_its_spec(cid):
    shape = parse_hf_config(_published(cid))
    spec = match_spec(shape, _specs(), REF / PUBLISHED[cid])
    assert spec is not None and spec.id == cid
    assert shape.param_count() == spec.text_params
    assert shape.mtp_param_count() == spec.mtp_params


@pytest.mark.parametrize("cid", list(PUBLISHED))
def test_shipped_config_is_the_published_file(cid):
    shipped = (PLUGINS / PLUGIN_DIRS[cid] / "config.json").read_bytes()
    if REF is None:
        pytest.skip("../shared/reference/checkpoints is absent")
    assert shipped == (REF / PUBLISHED[cid] / "config.json").read_bytes()


@pytest.mark.parametrize("cid", list(PUBLISHED))
def test_param_counts_equal_the_published_inventory(cid):
    if REF is None:
        pytest.skip("../shared/reference/checkpoints is absent")
    inv = json.loads((REF / PUBLISHED[cid] / "tensor_inventory.DERIVED.json").read_text())["tensors"]
    text = sum(math.prod(t["shape"]) for n, t in inv.items() if not n.startswith(("mtp.", "model.visual.")))
    mtp = sum(math.prod(t["shape"]) for n, t in inv.items() if n.startswith("mtp."))
    shape = parse_hf_config(_published(cid))
    assert (shape.param_count(), shape.mtp_param_count()) == (text, mtp)


def test_chat_template_identity():
    if REF is None:
        pytest.skip("../shared/reference/checkpoints is absent")
    import hashlib

    by_id = {s.id: s for s in _specs()}
    for cid in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        data = (REF / PUBLISHED[cid] / "chat_template.jinja").read_bytes()
        assert hashlib.sha256(data).hexdigest() == by_id[cid].chat_template_sha256


def test_same_shape_ids_are_told_apart_by_path(tmp_path):
    shape = parse_hf_config(_published("qwen3.8-27b"))
    hub = tmp_path / "models--Qwen--Qwen3.8-27B" / "snapshots" / "abc"
    hub.mkdir(parents=True)
    assert match_spec(shape, _specs(), hub).id == "qwen3.8-27b"
    plain = tmp_path / "ckpt"
    plain.mkdir()
    (plain / "chat_template.jinja").write_bytes((REF / PUBLISHED["qwen3.6-27b"] / "chat_template.jinja").read_bytes())
    assert match_spec(shape, _specs(), plain).id == "qwen3.6-27b"
    # without any hint: the lowest id, deterministically
    assert match_spec(shape, _specs()).id == "qwen3.6-27b"


def test_27b_facts():
    s = parse_hf_config(_published("qwen3.6-27b"))
    assert (s.hidden_size, s.num_hidden_layers, s.rotary_dim, s.conv_dim) == (5120, 64, 64, 10240)
    assert s.full_layers == tuple(range(3, 64, 4))
    # spec section 2.4: 144 MiB recurrent + 2.81 MiB conv per sequence
    assert s.state_bytes_per_sequence() == 48 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)
    assert s.kv_bytes_per_token("bf16") == 16 * 2 * 1024 * 2
    assert s.kv_bytes_per_token("int8") == 16 * 2 * (1024 + 1024 // 64 * 2)
    assert s.kv_bytes_per_token("fp8") == 16 * 2 * 1024


def test_moe_facts():
    s = parse_hf_config(_published("qwen3.6-35b-a3b"))
    assert s.is_moe and (s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size) == (256, 8, 512)
    assert s.linear_num_value_heads // s.linear_num_key_heads == 2
    assert s.num_attention_heads // s.num_key_value_heads == 8


def test_flat_text_config_and_fallbacks():
    # transformers' CausalLM save: flat text config; layer_types from full_attention_interval,
    # rope facts at the top level (older files)
    cfg = {
        "model_type": "qwen3_5_text", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8, "rope_theta": 1e6, "partial_rotary_factor": 0.5,
    }  # fmt: skip
    s = parse_hf_config(cfg)
    assert isinstance(s, QwenHybridShape)
    assert s.full_layers == (3, 7) and s.rotary_dim == 8 and s.rope_theta == 1e6
    assert match_spec(s, _specs()) is None


def test_other_families_are_not_ours():
    assert parse_hf_config({"model_type": "llama", "hidden_size": 4096}) is None
    assert get_plugin_manager().hook.ninfer_parse_config(hf_config={"model_type": "llama"}) is None


def test_incomplete_config_names_the_field():
    cfg = _published("qwen3.6-27b")
    del cfg["text_config"]["linear_num_value_heads"]
    with pytest.raises(CheckpointError, match="linear_num_value_heads"):
        parse_hf_config(cfg)


def test_bad_ratio_is_refused():
    cfg = _published("qwen3.6-27b")
    cfg["text_config"]["num_key_value_heads"] = 5
    with pytest.raises(CheckpointError, match="num_key_value_heads"):
        parse_hf_config(cfg)
