"""Finding checkpoints (path, --weights, $NINFER_MODELS, the HF cache, offline) and reading
safetensors safely: every broken file fails with a CheckpointError naming the file or tensor."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from ninfer.checkpoint import WeightSource, load_hf_config, locate, match_spec
from ninfer.errors import CheckpointError, UserError
from ninfer.testing import make_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("tiny"), vocab=64, layers=4)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return make_tiny("qwen3.6-35b-a3b", tmp_path_factory.mktemp("sharded"), vocab=64, shards=3)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No real HF cache or model store leaks into the test."""
    for var in ("NINFER_MODELS", "HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def _copy(src, dst):
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


# --- WeightSource --------------------------------------------------------------------------------


def test_reads_single_and_sharded(tiny, sharded):
    one = WeightSource(tiny)
    assert one.has("lm_head.weight") and one.get("lm_head.weight").dtype == torch.bfloat16
    many = WeightSource(sharded)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    assert many.names() == sorted(index)
    assert many.get("model.language_model.layers.0.mlp.experts.gate_up_proj").shape == (16, 64, 64)


def test_truncated_file(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "t")
    f = bad / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is truncated: tensor .* needs bytes") as e:
        WeightSource(bad)
    assert e.value.tensor


def test_truncated_inside_header(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "t")
    f = bad / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated or corrupt: its header claims"):
        WeightSource(bad)


def test_corrupt_header(tmp_path):
    f = tmp_path / "model.safetensors"
    junk = b"{not json" + b" " * 7
    f.write_bytes(struct.pack("<Q", len(junk)) + junk)
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        WeightSource(tmp_path)


def test_header_sizes_disagree_with_dtype(tmp_path):
    f = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    f.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(CheckpointError, match=r"tensor w F32\[4\] should take 16 bytes") as e:
        WeightSource(tmp_path)
    assert e.value.tensor == "w"


def test_missing_tensor_and_wrong_shape(tiny):
    src = WeightSource(tiny)
    with pytest.raises(CheckpointError, match="no tensor model.language_model.layers.9.mlp.up_proj.weight"):
        src.get("model.language_model.layers.9.mlp.up_proj.weight")
    with pytest.raises(CheckpointError, match=r"lm_head.weight has shape \[64, 64\], the model expects \[65, 64\]"):
        src.get("lm_head.weight", shape=(65, 64))


def test_missing_shard(sharded, tmp_path):
    bad = _copy(sharded, tmp_path / "s")
    (bad / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match="lists shard model-00002-of-00003.safetensors .* is missing") as e:
        WeightSource(bad)
    assert e.value.tensor


def test_index_names_a_tensor_its_shard_lacks(sharded, tmp_path):
    bad = _copy(sharded, tmp_path / "s")
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.language_model.ghost.weight"] = "model-00001-of-00003.safetensors"
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="puts tensor model.language_model.ghost.weight in model-00001"):
        WeightSource(bad)


def test_unindexed_shards_are_merged(tmp_path):
    save_file({"a": torch.zeros(2)}, str(tmp_path / "part1.safetensors"))
    save_file({"b": torch.ones(3)}, str(tmp_path / "part2.safetensors"))
    assert WeightSource(tmp_path).names() == ["a", "b"]


def test_no_safetensors(tmp_path):
    with pytest.raises(CheckpointError, match="no .safetensors files"):
        WeightSource(tmp_path)


# --- config and matching -------------------------------------------------------------------------


def test_load_hf_config_errors(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        load_hf_config(tmp_path)


def test_tiny_runs_generic(tiny, clean_env):
    found = locate(str(tiny))
    assert found.found_in == "--model" and found.generic and found.shape.hidden_size == 64


def test_unknown_family_is_refused(tmp_path, clean_env):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"a": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="'llama', which no installed plugin runs"):
        locate(str(tmp_path))


def test_match_spec_needs_every_field():
    from ninfer.plugins import get_plugin_manager
    from ninfer_plugins.qwen36_35b_a3b.plugin import SHAPE
    from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape

    specs = get_plugin_manager().collect("ninfer_checkpoints")
    assert match_spec(QwenHybridShape(**SHAPE), specs).id == "qwen3.6-35b-a3b"
    assert match_spec(QwenHybridShape(**{**SHAPE, "num_experts_per_tok": 4}), specs) is None


# --- locate --------------------------------------------------------------------------------------


def _fake_real(tiny, dst):
    """A directory holding the published 27B config.json (and tiny tensors): locate only reads config."""
    from pathlib import Path

    d = _copy(tiny, dst)
    published = Path(__file__).resolve().parents[2] / "plugins" / "qwen36_27b" / "config.json"
    (d / "config.json").write_bytes(published.read_bytes())
    return d


def test_unknown_id_lists_registered_ids(clean_env):
    with pytest.raises(UserError, match="registered ids: qwen3.6-27b, qwen3.6-35b-a3b, qwen3.8-27b"):
        locate("qwen9-1b")


def test_nothing_found_lists_every_place(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    with pytest.raises(UserError) as e:
        locate("qwen3.6-27b", weights=str(tmp_path / "w"))
    msg = e.value.message
    for place in (tmp_path / "w", tmp_path / "store" / "qwen3.6-27b", tmp_path / "hub" / "models--Qwen--Qwen3.6-27B",
                  tmp_path / "hfhome" / "hub" / "models--Qwen--Qwen3.6-27B",
                  tmp_path / "home" / ".cache" / "huggingface" / "hub" / "models--Qwen--Qwen3.6-27B"):  # fmt: skip
        assert str(place) in msg
    assert "--weights" in msg


def test_found_in_weights_dir(tiny, clean_env, tmp_path):
    d = _fake_real(tiny, tmp_path / "w")
    found = locate("Qwen/Qwen3.6-27B", weights=str(d))
    assert found.found_in == "--weights" and found.spec.id == "qwen3.6-27b" and found.path == d


def test_found_in_ninfer_models(tiny, clean_env, monkeypatch, tmp_path):
    _fake_real(tiny, tmp_path / "store" / "qwen3.6-27b")
    monkeypatch.setenv("NINFER_MODELS", str(tmp_path / "store"))
    found = locate("qwen36-27b")  # an alias
    assert found.found_in == "$NINFER_MODELS" and found.spec.id == "qwen3.6-27b"


def test_found_in_hf_cache_via_refs_main(tiny, clean_env, monkeypatch, tmp_path):
    repo = tmp_path / "hub" / "models--Qwen--Qwen3.6-27B"
    _fake_real(tiny, repo / "snapshots" / "old")
    _fake_real(tiny, repo / "snapshots" / "6a9e13bd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("6a9e13bd\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    found = locate("qwen3.6-27b")
    assert found.found_in == "Hugging Face cache" and found.path.name == "6a9e13bd"


def test_id_with_other_shape_runs_generic(tiny, clean_env, tmp_path):
    found = locate("qwen3.6-27b", weights=str(_copy(tiny, tmp_path / "w")))
    assert found.spec is None and found.generic


def test_path_errors(tmp_path, clean_env):
    with pytest.raises(UserError, match="no such directory"):
        locate(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="has no config.json"):
        locate(str(tmp_path))
