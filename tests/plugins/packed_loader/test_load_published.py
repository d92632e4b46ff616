"""Published NVFP4 checkpoints (ModelOpt and compressed-tensors layouts, exact published tensor
names) load unchanged through `--model DIR`: excluded modules dense, FP8 modules dense, experts one
module per expert. The oracle is a plain fp32 checkpoint holding the dequantized weights: the
reference kernels dequantize to the same fp32 values, so logits are bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.cli import main
from ninfer.linear import DENSE, PackedWeight, QLinear
from ninfer.testing import greedy_generate, load_model, make_tiny
from ninfer_plugins.packed_loader.published import published_quant_config
from ninfer_plugins.quant_nvfp4 import formats as F
from ninfer_plugins.qwen_hybrid.layers import ExpertBank

PROMPT = [5, 17, 300, 42, 7, 99, 250, 3]
RUN = ["--prompt-ids", ",".join(map(str, PROMPT)), "--raw", "--greedy", "--json", "--device", "cpu", "--max-new", "3", "--ignore-eos"]
L = "model.language_model."

# As NVIDIA ships Qwen3.6-35B-A3B-NVFP4 (shared/reference/checkpoints/nvidia__*): attention and
# GDN projections FP8, experts / shared expert / head W4A16 NVFP4, the rest bf16.
FP8_LEAVES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj")  # fmt: skip


def _linear_modules(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Every 2-D text linear (published names) of a tiny checkpoint, experts one per expert."""
    out = []
    for name, t in tensors.items():
        if t.dim() != 2 or not name.endswith(".weight") or not name.startswith((L, "lm_head")):
            continue
        if name.endswith(("embed_tokens.weight", "norm.weight")):
            continue
        out.append(name.removesuffix(".weight"))
    return out


def _excluded(module: str, moe: bool) -> bool:
    if module.endswith(("in_proj_a", "in_proj_b", "mlp.gate", "shared_expert_gate")):
        return True
    return module == "lm_head" and not moe  # the dense checkpoints keep the head bf16, the MoE one quantizes it


def _write(out: Path, src: Path, tensors: dict, cfg_patch: dict, extra: dict[str, dict] | None = None) -> Path:
    out.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(cfg_patch)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for name, data in (extra or {}).items():
        (out / name).write_text(json.dumps(data, indent=2))
    names = sorted(tensors)
    half = len(names) // 2
    index = {"metadata": {}, "weight_map": {}}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(out / fname))
        index["weight_map"].update(dict.fromkeys(part, fname))
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def build(root: Path, moe: bool, producer: str) -> tuple[Path, Path, set[str]]:
    """(published checkpoint, fp32 oracle, modules that must load as NVFP4)."""
    src = make_tiny("qwen3.6-35b-a3b" if moe else "qwen3.6-27b", root / "bf16", seed=11, vocab=512,
                    expert_layout="per_expert", layers=None if moe else 4)  # fmt: skip
    base = load_file(str(src / "model.safetensors"))
    pub: dict[str, torch.Tensor] = {}
    oracle: dict[str, torch.Tensor] = {}
    nvfp4: set[str] = set()
    modules = set(_linear_modules(base))
    for name, t in base.items():
        module = name.removesuffix(".weight")
        if module not in modules or _excluded(module, moe):
            pub[name] = t
            oracle[name] = t
            continue
        w = t.float()
        if moe and module.endswith(FP8_LEAVES):
            s = w.abs().amax() / 448.0
            q = (w / s).to(torch.float8_e4m3fn)
            pub.update({name: q, module + ".weight_scale": s.reshape(()), module + ".input_scale": torch.tensor(0.25)})
            oracle[name] = (q.float() * s).to(torch.bfloat16)
            continue
        p = F.quantize(w)
        g = p.tensors["weight_scale_2"]
        nvfp4.add(module)
        if producer == "modelopt":
            pub.update({name: p.tensors["weight"], module + ".weight_scale": p.tensors["weight_scale"],
                        module + ".weight_scale_2": g, module + ".input_scale": torch.tensor(0.5)})  # fmt: skip
        else:
            gs = (torch.ones(()) / g).reshape(1)
            pub.update({module + ".weight_packed": p.tensors["weight"], module + ".weight_scale": p.tensors["weight_scale"],
                        module + ".weight_global_scale": gs, module + ".input_global_scale": torch.tensor([2.0])})  # fmt: skip
            g = torch.ones((), dtype=torch.float32) / gs.reshape(())  # what a reader gets back: fp32(1 / (1 / g))
        oracle[name] = F.dequantize(PackedWeight(F.SCHEME, p.shape, {**p.tensors, "weight_scale_2": g}))
    if producer == "modelopt":
        exclude = ["lm_head", "*in_proj_a*", "*in_proj_b*", "*mlp.gate", "*shared_expert_gate*", "mtp*", "model.visual*"]
        if moe:
            exclude.remove("lm_head")
        quant = {"quant_algo": "MIXED_PRECISION" if moe else "NVFP4", "group_size": 16, "exclude_modules": exclude}
        if moe:
            quant["quantized_layers"] = {
                **{m: {"quant_algo": "FP8"} for m in modules if m.endswith(FP8_LEAVES)},
                **{m: {"quant_algo": "W4A16_NVFP4", "group_size": 16} for m in nvfp4},
            }
        hf_quant = {"producer": {"name": "modelopt", "version": "0.44.0"}, "quantization": quant}
        qc = {"quant_method": "modelopt", **{k: v for k, v in quant.items() if k != "quantized_layers"}}
        pub_dir = _write(root / "published", src, pub, {"quantization_config": qc}, {"hf_quant_config.json": hf_quant})
    else:
        ignore = ["re:.*in_proj_[ab]$", "re:.*mlp\\.gate$", "re:.*shared_expert_gate$", "re:^mtp.*", "re:.*visual.*"]
        if not moe:
            ignore.insert(0, "lm_head")
        qc = {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
                                          "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}},  # fmt: skip
            "ignore": ignore,
        }
        if moe:
            qc["config_groups"]["group_1"] = {"targets": [m for m in modules if m.endswith(FP8_LEAVES)],
                                              "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}  # fmt: skip
        pub_dir = _write(root / "published", src, pub, {"quantization_config": qc})
    oracle_dir = _write(root / "oracle", src, oracle, {})
    return pub_dir, oracle_dir, nvfp4


@pytest.fixture(scope="module", params=[("modelopt", False), ("modelopt", True), ("compressed-tensors", False), ("compressed-tensors", True)],
                ids=["modelopt-dense", "modelopt-moe", "ct-dense", "ct-moe"])  # fmt: skip
def published(request, tmp_path_factory):
    producer, moe = request.param
    return (*build(tmp_path_factory.mktemp(f"{producer}-{moe}"), moe, producer), moe)


def _logits(model) -> torch.Tensor:
    cache = model.allocate_cache(1, 16, "bf16")
    return model.compute_logits(model.forward(torch.tensor(PROMPT), cache, 0, 0))


def test_loads_unchanged_with_exact_logits(monkeypatch, published):
    pub, oracle, nvfp4, moe = published
    # dense experts would take the batched-gather path; the per-expert loop is the one both share
    monkeypatch.setattr(ExpertBank, "GATHER_MAX_PAIRS", 0)
    got, want = load_model(pub), load_model(oracle)
    linears = {m.name: m for m in got.modules() if isinstance(m, QLinear)}
    for module in nvfp4:
        c = module.removeprefix(L)
        if ".experts." in c:
            c = c.rsplit(".", 1)[0] + ".gate_up_proj" if c.endswith(("gate_proj", "up_proj")) else c
        assert linears[c].scheme == "nvfp4", c
    assert linears["layers.0.linear_attn.in_proj_a"].scheme == DENSE  # excluded: loaded dense
    assert linears["lm_head"].scheme == ("nvfp4" if moe else DENSE)
    if moe:
        assert linears["layers.3.self_attn.q_proj"].scheme == DENSE  # FP8 -> bf16
        assert linears["layers.0.mlp.shared_expert.up_proj"].scheme == "nvfp4"
        assert linears["layers.0.mlp.gate"].scheme == DENSE
        # gate and up were quantized apart: their global scales stay per row
        assert linears["layers.1.mlp.experts.2.gate_up_proj"].packed.tensors["weight_scale_2"].numel() == 2 * got.shape.moe_intermediate_size
    assert torch.equal(_logits(got), _logits(want))


def test_cli_tokens_match_the_oracle(capsys, monkeypatch, published):
    """`ninfer --model PUBLISHED ... --json` (plan, loader hook, engine) against greedy decoding of
    the oracle model."""
    pub, oracle, _, _ = published
    monkeypatch.setattr(ExpertBank, "GATHER_MAX_PAIRS", 0)
    want = greedy_generate(load_model(oracle), PROMPT, 3)
    rc = main(["--model", str(pub), *RUN])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["token_ids"] == want


def test_recognised_layouts_and_refusals(capsys, tmp_path, published):
    pub, oracle, _, _ = published
    assert published_quant_config(pub) is not None and published_quant_config(oracle) is None
    rc = main(["--model", str(pub), "--quant", "int4", *RUN])
    err = capsys.readouterr().err
    assert rc == 2 and "holds NVFP4 weights as published" in err
    rc = main(["convert", "--model", str(pub), "--quant", "int4", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "already quantized" in err and not (tmp_path / "x").exists()


def test_damaged_scales_name_the_tensor(capsys, tmp_path):
    pub, _, nvfp4 = build(tmp_path, moe=False, producer="modelopt")
    module = sorted(nvfp4)[0]
    f = next(f for f in sorted(pub.glob("model-*.safetensors")) if module + ".weight_scale" in load_file(str(f)))
    tensors = load_file(str(f))
    tensors[module + ".weight_scale"] = tensors[module + ".weight_scale"][:, :1].contiguous()
    save_file(tensors, str(f))
    rc = main(["--model", str(pub), *RUN])
    err = capsys.readouterr().err
    assert rc == 2 and f"{module}.weight_scale should be float8_e4m3fn" in err
