"""`ninfer convert` then `--model OUT`: the same packed bytes as `--model SRC --quant Q`, so the same
tokens; only bytes are copied when loading; a damaged directory fails with one clear sentence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.cli import main
from ninfer.linear import DENSE
from ninfer.testing import load_model, make_tiny
from ninfer_plugins.packed_loader.convert import pack_weight, source_digest
from ninfer_plugins.quant_int import formats as IF
from ninfer_plugins.quant_int.artifact import MANIFEST

PROMPT = "5,17,300,42,7,99,250,3"
RUN = ["--prompt-ids", PROMPT, "--raw", "--greedy", "--json", "--device", "cpu", "--max-new", "3", "--ignore-eos"]


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    return {
        "dense": make_tiny("qwen3.6-27b", root / "dense", seed=5, vocab=512, layers=4),
        # transformers' per-expert layout: convert stacks it like the loader does
        "moe": make_tiny("qwen3.6-35b-a3b", root / "moe", seed=6, vocab=512, expert_layout="per_expert"),
    }


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    """(model, quant) -> converted directory, made once through the CLI."""
    root = tmp_path_factory.mktemp("out")
    made: dict[tuple[str, str], Path] = {}

    def get(model: str, quant: str) -> Path:
        if (model, quant) not in made:
            out = root / f"{model}-{quant}"
            assert main(["convert", "--model", str(sources[model]), "--quant", quant, "--out", str(out)]) == 0
            made[model, quant] = out
        return made[model, quant]

    return get


def _no_quantizing(monkeypatch):
    """Loading a converted directory must not encode anything."""
    from ninfer_plugins.quant_int import formats as F
    from ninfer_plugins.quant_nvfp4 import formats as NF

    def refuse(*a, **k):
        raise AssertionError("a converted directory was requantized while loading")

    monkeypatch.setattr(F, "quantize", refuse)
    monkeypatch.setattr(NF, "quantize", refuse)


@pytest.mark.parametrize(
    "model,quant",
    [("dense", "int4"), ("dense", "int8"), ("dense", "nvfp4"), ("moe", "bf16")]
    + [pytest.param("moe", q, marks=pytest.mark.slow) for q in ("int4", "int8", "nvfp4")],
)
def test_converted_runs_like_quantizing_at_load(capsys, monkeypatch, sources, converted, model, quant):
    src = sources[model]
    out = converted(model, quant)
    capsys.readouterr()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["recipe"] == quant and manifest["source_digest"] == source_digest(src)
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert (out / "mtp.safetensors").is_file()
    # make_tiny copies the published template only when ../shared is present
    assert (out / "chat_template.jinja").is_file() == (src / "chat_template.jinja").is_file()
    if quant != "bf16":
        assert manifest["schemes"] and all(v == 1 for v in manifest["schemes"].values())

    rc, text, err = run_cli(capsys, "--model", str(src), "--quant", quant, *RUN)
    assert rc == 0, err
    want = json.loads(text)["token_ids"]
    with monkeypatch.context() as m:
        _no_quantizing(m)
        rc, text, err = run_cli(capsys, "--model", str(out), *RUN)
    assert rc == 0, err
    assert json.loads(text)["token_ids"] == want


def test_same_packed_bytes_and_schemes(monkeypatch, sources, converted):
    """Weight by weight, the converted model holds the bytes the load-time path packs, in the same
    schemes (the recipe is not asked again: a plain `--model OUT` builds a bf16 model whose linears
    take the scheme their weight arrived in)."""
    src, out = sources["moe"], converted("moe", "nvfp4")
    a = load_model(src, quant="nvfp4")
    with monkeypatch.context() as m:
        _no_quantizing(m)
        b = load_model(out)
    from ninfer.linear import QLinear

    la = {x.name: x for x in a.modules() if isinstance(x, QLinear)}
    lb = {x.name: x for x in b.modules() if isinstance(x, QLinear)}
    assert set(la) == set(lb)
    for name, x in la.items():
        y = lb[name]
        assert (x.scheme, type(x.kernel)) == (y.scheme, type(y.kernel)), name
        for part, t in x.packed.tensors.items():
            assert torch.equal(t.view(-1).view(torch.uint8), y.packed.tensors[part].contiguous().view(-1).view(torch.uint8)), (name, part)
    assert la["lm_head"].scheme == "q8_g32" and la["layers.0.mlp.experts.3.down_proj"].scheme == "nvfp4"
    assert la["layers.0.linear_attn.in_proj_a"].scheme == DENSE
    assert torch.equal(a.embed_tokens, b.embed_tokens)
    assert type(a.layers[0].mlp.experts.kernel) is type(b.layers[0].mlp.experts.kernel)
    # the MTP block, read only when a speculator asks, comes from mtp.safetensors unchanged
    mtp_a, mtp_b = a.load_mtp_weights(), b.load_mtp_weights()
    assert set(mtp_a) == set(mtp_b) and "mtp.layers.0.mlp.experts.gate_up_proj" in mtp_b
    assert all(torch.equal(mtp_a[n], mtp_b[n]) for n in mtp_a)


def test_row_blocks_give_the_same_bytes():
    torch.manual_seed(0)
    w = torch.randn(37, 300).to(torch.bfloat16)
    from ninfer.plugins import get_plugin_manager

    schemes = {s.name: s for s in get_plugin_manager().collect("ninfer_quant_schemes")}
    for name in IF.FORMATS:
        whole, blocks = pack_weight(schemes[name], w, row_block=1 << 30), pack_weight(schemes[name], w, row_block=1000)
        assert blocks.meta == whole.meta and blocks.shape == whole.shape
        for part, t in whole.tensors.items():
            assert torch.equal(t, blocks.tensors[part]), (name, part)


def test_digest_reads_headers_not_data(tmp_path, sources):
    src = tmp_path / "copy"
    shutil.copytree(sources["dense"], src)
    d = source_digest(src)
    f = src / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # one byte of data: not part of the digest
    f.write_bytes(bytes(data))
    assert source_digest(src) == d
    (src / "config.json").write_text((src / "config.json").read_text() + " ")
    assert source_digest(src) != d


def test_refusals(capsys, tmp_path, sources, converted):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("keep me")
    rc, _, err = run_cli(capsys, "convert", "--model", str(sources["dense"]), "--quant", "int4", "--out", str(busy))
    assert rc == 2 and "already exists and is not empty" in err and (busy / "x").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run_cli(capsys, "convert", "--model", str(converted("dense", "int8")), "--quant", "int4", "--out", str(empty))
    assert rc == 2 and "already a `ninfer convert` directory" in err
    assert not any(tmp_path.glob(".empty.converting-*"))  # nothing half-written left behind
    rc, _, err = run_cli(capsys, "--model", str(converted("dense", "int8")), "--quant", "int4", *RUN)
    assert rc == 2 and "was converted with --quant int8" in err


def _damaged(tmp_path: Path, src: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(src, out)
    return out


def _rewrite_shard(out: Path, edit) -> None:
    for f in sorted(out.glob("model-*.safetensors")):
        tensors = load_file(str(f))
        edit(tensors)
        save_file(tensors, str(f), metadata={"format": "ninfer-packed"})


def _fails(capsys, path: Path, *needles: str) -> None:
    rc, out, err = run_cli(capsys, "--model", str(path), *RUN)
    assert rc == 2 and out == "", err
    line = err.strip().splitlines()[-1]
    assert line.startswith("ninfer: error:"), err
    for needle in needles:
        assert needle in line, line


def test_damaged_directories_fail_clearly(capsys, tmp_path, converted):
    good = converted("dense", "int4")
    capsys.readouterr()  # a conversion made here (the test run alone) prints its path
    manifest = json.loads((good / MANIFEST).read_text())
    assert manifest["linears"]["layers.0.mlp.gate_proj"]["scheme"] == "q4_g64"

    bad = _damaged(tmp_path, good, "version")
    m = json.loads((bad / MANIFEST).read_text())
    m["schemes"]["q4_g64"] = 99
    (bad / MANIFEST).write_text(json.dumps(m))
    _fails(capsys, bad, "q4_g64 version 99", "reads version 1", "run ninfer convert again")

    bad = _damaged(tmp_path, good, "deleted")
    _rewrite_shard(bad, lambda t: t.pop("layers.0.mlp.gate_proj.qweight", None))
    _fails(capsys, bad, "tensor layers.0.mlp.gate_proj.qweight is missing", "run ninfer convert again")

    bad = _damaged(tmp_path, good, "shape")
    _rewrite_shard(bad, lambda t: t.update({"layers.1.mlp.down_proj.scales": t["layers.1.mlp.down_proj.scales"][:, :1].contiguous()})
                   if "layers.1.mlp.down_proj.scales" in t else None)
    _fails(capsys, bad, "layers.1.mlp.down_proj.scales is F16", "ninfer.json says F16", "run ninfer convert again")

    bad = _damaged(tmp_path, good, "other-model")
    m = json.loads((bad / MANIFEST).read_text())
    m["linears"]["layers.0.mlp.up_proj"]["shape"] = [64, 64]
    (bad / MANIFEST).write_text(json.dumps(m))
    _fails(capsys, bad, "layers.0.mlp.up_proj")

    bad = _damaged(tmp_path, good, "plain")
    m = json.loads((bad / MANIFEST).read_text())
    m["tensors"]["norm.weight"]["shape"] = [32]
    (bad / MANIFEST).write_text(json.dumps(m))
    _fails(capsys, bad, "tensor norm.weight is [32] but the model expects [64]")

    for name, size in (("truncated", 1_000), ("header-cut", 10)):
        bad = _damaged(tmp_path, good, name)
        shard = sorted(bad.glob("*.safetensors"))[0]
        with open(shard, "r+b") as f:
            f.truncate(size)
        _fails(capsys, bad, shard.name, "run ninfer convert again")


def test_plan_reads_the_recipe_of_a_convert_directory(converted):
    """--quant auto on a convert directory plans memory and kernels for its recipe, not bf16."""
    from ninfer.config import EngineConfig
    from ninfer.startup import plan

    out = converted("dense", "int4")
    p = plan(EngineConfig(model=str(out), device="cpu"))
    assert p.config.quant == "int4"
    assert any(c.slot.startswith("linear[q4_g64") for c in p.choices)
