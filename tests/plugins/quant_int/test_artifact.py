"""`ninfer convert` output: write packed weights, read them back, fail clearly on mismatches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.errors import CheckpointError
from ninfer.linear import dense_weight
from ninfer_plugins.quant_int import formats as F
from ninfer_plugins.quant_int.artifact import MANIFEST, load_packed, save_packed, scheme_versions
from ninfer_plugins.quant_nvfp4 import formats as NF

VERSIONS = {"q4_g64": 1, "q5_g64": 1, "q6_g64": 1, "q8_g32": 1, "nvfp4": 1}


def _write(tmp_path: Path, shard_bytes: int = 4 << 30) -> dict:
    torch.manual_seed(0)
    linears = {
        "layers.0.mlp.gate_proj": F.quantize(torch.randn(64, 200), "q4_g64"),
        "layers.0.mlp.down_proj": F.quantize(torch.randn(200, 64), "q5_g64"),
        "lm_head": F.quantize(torch.randn(32, 128), "q6_g64"),
        "mtp.fc": F.quantize(torch.randn(16, 96), "q8_g32"),
        "layers.0.linear_attn.in_proj_a": dense_weight(torch.randn(4, 200).to(torch.bfloat16)),
        "layers.1.mlp.up_proj": NF.quantize(torch.randn(48, 64)),
    }
    plain = {"norm.weight": torch.randn(64), "embed_tokens.weight": torch.randn(10, 64).to(torch.bfloat16)}
    save_packed(tmp_path, linears, versions=VERSIONS, tensors=plain, recipe="int4", source_digest="abc", max_shard_bytes=shard_bytes, progress=False)
    return {"linears": linears, "plain": plain}


@pytest.mark.parametrize("shard_bytes", [4 << 30, 20_000])
def test_round_trip(tmp_path, shard_bytes):
    written = _write(tmp_path, shard_bytes)
    expected = {n: p.shape for n, p in written["linears"].items()}
    linears, plain, manifest = load_packed(tmp_path, versions=VERSIONS, expected=expected, progress=False)
    assert manifest["recipe"] == "int4" and manifest["schemes"]["nvfp4"] == 1
    if shard_bytes < 1 << 20:
        assert len(set(manifest["weight_map"].values())) > 1
    for name, p in written["linears"].items():
        q = linears[name]
        assert q.scheme == p.scheme and tuple(q.shape) == tuple(p.shape)
        assert set(q.tensors) == set(p.tensors)
        for part, t in p.tensors.items():
            assert q.tensors[part].dtype == t.dtype and torch.equal(q.tensors[part].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    for name, t in written["plain"].items():
        assert torch.equal(plain[name], t)
    assert "layers.0.mlp.gate_proj.qweight" in load_file(str(tmp_path / manifest["weight_map"]["layers.0.mlp.gate_proj.qweight"]))


def test_wrong_scheme_version(tmp_path):
    _write(tmp_path)
    with pytest.raises(CheckpointError, match="q5_g64 version 1, this ninfer reads version 2"):
        load_packed(tmp_path, versions={**VERSIONS, "q5_g64": 2}, progress=False)
    with pytest.raises(CheckpointError, match="no installed plugin provides"):
        load_packed(tmp_path, versions={k: v for k, v in VERSIONS.items() if k != "nvfp4"}, progress=False)


def test_missing_tensor_and_bad_shape(tmp_path):
    _write(tmp_path)
    m = json.loads((tmp_path / MANIFEST).read_text())
    shard = tmp_path / m["weight_map"]["lm_head.scales"]
    data = load_file(str(shard))
    data.pop("lm_head.scales")
    save_file(data, str(shard))
    with pytest.raises(CheckpointError, match="lm_head.scales is missing"):
        load_packed(tmp_path, versions=VERSIONS, progress=False)


def test_bad_shape_recorded_consistently_is_caught_by_the_scheme(tmp_path):
    _write(tmp_path)
    m = json.loads((tmp_path / MANIFEST).read_text())
    # a manifest and shard that agree with each other but not with what q4 stores for [64, 200]
    shard = tmp_path / m["weight_map"]["layers.0.mlp.gate_proj.qweight"]
    data = load_file(str(shard))
    data["layers.0.mlp.gate_proj.qweight"] = data["layers.0.mlp.gate_proj.qweight"][:, :10].contiguous()
    save_file(data, str(shard))
    m["linears"]["layers.0.mlp.gate_proj"]["parts"]["qweight"]["shape"] = [64, 10]
    (tmp_path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="gate_proj.*qweight"):
        load_packed(tmp_path, versions=VERSIONS, progress=False)


def test_shape_disagreement_and_model_expectations(tmp_path):
    _write(tmp_path)
    m = json.loads((tmp_path / MANIFEST).read_text())
    m["linears"]["lm_head"]["parts"]["qweight"]["shape"] = [32, 65]
    (tmp_path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="lm_head.qweight is U8 \\[32, 64\\]"):
        load_packed(tmp_path, versions=VERSIONS, progress=False)
    _write(tmp_path)
    with pytest.raises(CheckpointError, match="model expects"):
        load_packed(tmp_path, versions=VERSIONS, expected={"lm_head": (33, 128)}, progress=False)
    with pytest.raises(CheckpointError, match="layers.9.mlp.up_proj is missing"):
        load_packed(tmp_path, versions=VERSIONS, expected={"layers.9.mlp.up_proj": (8, 8)}, progress=False)


def test_not_a_converted_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not a `ninfer convert` directory"):
        load_packed(tmp_path, versions=VERSIONS, progress=False)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "ninfer-packed", "format_version": 9}))
    with pytest.raises(CheckpointError, match="version 9"):
        load_packed(tmp_path, versions=VERSIONS, progress=False)


def test_installed_versions_come_from_the_plugins():
    v = scheme_versions()
    assert v["q4_g64"] == 1 and v["nvfp4"] == 1
