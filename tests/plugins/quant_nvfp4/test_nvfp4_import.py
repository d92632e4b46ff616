"""Importing ModelOpt and compressed-tensors NVFP4 checkpoints gives the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ninfer.errors import CheckpointError
from ninfer_plugins.quant_nvfp4 import formats as F
from ninfer_plugins.quant_nvfp4.importer import QuantConfig, canonical_name, import_linears, parse_quant_config

P = "model.language_model.layers.0."


def _modelopt_and_ct(seed: int = 0) -> tuple[dict, dict, dict]:
    torch.manual_seed(seed)
    dense = {
        P + "mlp.gate_proj": torch.randn(32, 64),
        P + "mlp.down_proj": torch.randn(64, 32) * 3,
        "lm_head": torch.randn(48, 64),
    }
    mo: dict[str, torch.Tensor] = {}
    ct: dict[str, torch.Tensor] = {}
    for name, w in dense.items():
        p = F.quantize(w)
        g = p.tensors["weight_scale_2"]
        mo[name + ".weight"] = p.tensors["weight"]
        mo[name + ".weight_scale"] = p.tensors["weight_scale"]
        mo[name + ".weight_scale_2"] = g
        mo[name + ".input_scale"] = torch.tensor(0.5)
        # the compressed-tensors converter: rename, invert both global scales
        ct[name + ".weight_packed"] = p.tensors["weight"]
        ct[name + ".weight_scale"] = p.tensors["weight_scale"]
        ct[name + ".weight_global_scale"] = (torch.ones(1) / g).reshape(1)
        ct[name + ".input_global_scale"] = torch.tensor([2.0])
    for sd in (mo, ct):
        sd[P + "linear_attn.in_proj_a.weight"] = torch.randn(4, 64).to(torch.bfloat16)
        sd[P + "input_layernorm.weight"] = torch.randn(64).to(torch.bfloat16)
        sd[P + "linear_attn.A_log"] = torch.randn(4)
    return dense, mo, ct


def test_both_layouts_give_identical_weights():
    dense, mo, ct = _modelopt_and_ct()
    a = dict(import_linears(mo, parse_quant_config(hf_quant_config={"quantization": {"quant_algo": "NVFP4", "group_size": 16}})))
    b = dict(import_linears(ct, parse_quant_config({"quantization_config": {"quant_method": "compressed-tensors"}})))
    assert sorted(a) == sorted(b) == sorted([*dense, P + "linear_attn.in_proj_a"])
    for name in dense:
        assert a[name].scheme == b[name].scheme == "nvfp4"
        # codes and block scales are the published bytes, untouched
        assert a[name].tensors["weight"] is mo[name + ".weight"]
        assert torch.equal(F.dequantize(a[name]), F.dequantize(b[name]))
        assert a[name].meta["input_scale"] == b[name].meta["input_scale"] == 0.5
        assert torch.equal(F.dequantize(a[name]), F.dequantize(F.quantize(dense[name])))
    assert a[P + "linear_attn.in_proj_a"].scheme == "bf16"


def test_from_a_safetensors_directory(tmp_path: Path):
    from ninfer.checkpoint import WeightSource

    _, mo, _ = _modelopt_and_ct(1)
    save_file(mo, str(tmp_path / "model.safetensors"))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}}))
    got = dict(import_linears(WeightSource(tmp_path), parse_quant_config(hf_quant_config=json.loads((tmp_path / "hf_quant_config.json").read_text()))))
    assert got[P + "mlp.gate_proj"].shape == (32, 64)


def test_exclusion_lists_and_mixed_precision():
    cfg = parse_quant_config(
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "ignore": ["lm_head", "re:.*mlp\\.gate$", "re:model\\.visual.*", "mtp*"],
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
            }
        }
    )
    assert cfg.excluded("lm_head") and cfg.excluded(P + "mlp.gate") and not cfg.excluded(P + "mlp.gate_proj")
    assert cfg.excluded("mtp.fc") and cfg.excluded("model.visual.blocks.0.attn.qkv")
    mo = parse_quant_config(
        hf_quant_config={
            "quantization": {
                "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {P.rstrip(".") + ".mlp.experts": {"quant_algo": "NVFP4", "group_size": 16}},
                "exclude_modules": ["*in_proj_a*"],
            }
        }
    )
    assert mo.algo_for(P + "mlp.experts.5.down_proj") == "NVFP4"
    assert mo.excluded(P + "linear_attn.in_proj_a") and canonical_name(P + "mlp.up_proj") == "layers.0.mlp.up_proj"
    with pytest.raises(CheckpointError, match="group size 32"):
        parse_quant_config({"quant_method": "modelopt", "group_size": 32})


def test_reconstructed_nvidia_35b_config_parses():
    root = Path(__file__).resolve().parents[4] / "shared/reference/checkpoints/nvidia__Qwen3.6-35B-A3B-NVFP4"
    if not root.is_dir():
        pytest.skip("shared/ reference files are not beside this checkout")
    cfg = parse_quant_config(
        {"quantization_config": json.loads((root / "config.quantization_config.RECONSTRUCTED.json").read_text())},
        json.loads((root / "hf_quant_config.RECONSTRUCTED.json").read_text()),
    )
    assert cfg.producer == "modelopt"
    assert cfg.algo_for("model.language_model.layers.3.mlp.experts.7.gate_proj") == "W4A16_NVFP4"
    assert cfg.algo_for("model.language_model.layers.0.linear_attn.in_proj_qkv") == "FP8"
    assert cfg.excluded("mtp.layers.0.mlp.gate")


def test_fp8_modules_become_dense_and_bad_tensors_fail():
    w = (torch.randn(8, 32) * 4).to(torch.float8_e4m3fn)
    sd = {
        "a.weight": w,
        "a.weight_scale": torch.tensor(0.5),
        "b.weight": w,
        "b.weight_scale": torch.full((8,), 2.0, dtype=torch.bfloat16),
    }
    got = dict(import_linears(sd))
    assert got["a"].scheme == "bf16" and torch.equal(got["a"].tensors["weight"], (w.float() * 0.5).to(torch.bfloat16))
    assert torch.equal(got["b"].tensors["weight"], (w.float() * 2).to(torch.bfloat16))
    _, mo, _ = _modelopt_and_ct()
    mo[P + "mlp.gate_proj.weight_scale"] = mo[P + "mlp.gate_proj.weight_scale"][:, :1]
    with pytest.raises(CheckpointError, match="weight_scale should be float8_e4m3fn"):
        dict(import_linears(mo, QuantConfig("modelopt")))
