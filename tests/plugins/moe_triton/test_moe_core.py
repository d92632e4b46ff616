"""What the core says about an MoE model: the bytes a decode step reads (only the routed experts
it selects), the MoE kernel in the startup report, and when its decode step may be captured.

CPU (CI): a tiny Qwen3.6-35B-A3B checkpoint (16 experts, top 4) and the registered 35B shape.
"""

from __future__ import annotations

import json

import pytest
import torch

from ninfer.bench import experts_read, moe_read, weight_bytes_read
from ninfer.cli import main
from ninfer.config import EngineConfig
from ninfer.graphs import graphs_supported
from ninfer.startup import plan
from ninfer.testing import load_model, make_tiny
from ninfer_plugins.moe_triton.moe import TritonMoe

VOCAB = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("qwen3.6-35b-a3b", tmp_path_factory.mktemp("tiny_moe_core"), vocab=VOCAB, layers=2)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_distinct_experts_read():
    # one row reads exactly its top_k; rows never read more than every expert
    assert experts_read(256, 8, 1) == pytest.approx(8.0)
    assert experts_read(16, 4, 2) == pytest.approx(16 * (1 - (12 / 16) ** 2))
    assert experts_read(256, 8, 10_000) == pytest.approx(256.0)


@pytest.mark.parametrize("rows", [1, 3])
def test_weight_bytes_count_only_the_experts_a_step_reads(tiny, rows):
    model = load_model(tiny, "cpu")
    banks = [layer.mlp.experts for layer in model.layers]
    expert_ids = {id(q) for b in banks for q in (*b.gate_up, *b.down)}
    others = sum(_nbytes(m.prepared) for m in model.modules()
                 if hasattr(m, "prepared") and m.prepared is not None and id(m) not in expert_ids)
    small = sum(_nbytes(b) for n, b in model.named_buffers() if n != "embed_tokens")
    per_bank = [sum(_nbytes(q.prepared) for q in (*b.gate_up, *b.down)) for b in banks]
    E, k = model.shape.num_experts, model.shape.num_experts_per_tok
    used = experts_read(E, k, rows)
    routed = sum(per_bank) * used / E
    embed = rows * model.shape.hidden_size * 4
    assert weight_bytes_read(model, rows) == others + small + embed + int(routed)
    r = moe_read(model, rows)
    assert r["layers"] == 2 and r["experts"] == E and r["top_k"] == k
    assert r["experts_read_per_layer"] == pytest.approx(used, abs=0.01)
    assert r["routed_bytes_all"] == sum(per_bank) and r["routed_bytes_read"] == int(routed)
    if rows == 1:
        # decode at one request: the router's 4 of 16 experts a layer (the shared expert is a
        # plain linear, counted whole)
        assert r["routed_bytes_read"] == sum(per_bank) * k // E


def test_dense_models_report_no_moe(tmp_path):
    model = load_model(make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4), "cpu")
    assert moe_read(model, 1) is None


def test_bench_json_counts_the_experts_read(tiny, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(tiny), "--device", "cpu", "--random-weights", "--quant", "bf16",
            "--prompt-len", "12", "--gen-len", "4", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    r = json.loads(out.read_text())
    moe = r["moe"]
    assert moe["experts_read_per_layer"] == 4 and moe["experts"] == 16
    assert moe["routed_bytes_read"] * 4 == moe["routed_bytes_all"]
    assert r["bytes_per_step"]["weights"] > moe["routed_bytes_read"]
    assert "routed experts     4 of 16 read per layer" in table
    # the report names the MoE kernel like every other choice
    assert r["kernels"]["moe[bf16/bf16 16x64x32]"] == "torch.moe"


def test_startup_lists_the_moe_kernel_per_scheme_pair():
    p = plan(EngineConfig(model="qwen3.6-35b-a3b", quant="int4"), need_weights=False, strict=False)
    moe = {c.slot: c for c in p.choices if c.slot.startswith("moe[")}
    # int4 routes down in q5, and in q6 in layers 34, 38, 39: two kernels asked for
    assert set(moe) == {"moe[q4_g64/q5_g64 256x2048x512]", "moe[q4_g64/q6_g64 256x2048x512]"}
    for c in moe.values():
        if torch.cuda.is_available():
            assert c.name == "triton.moe"
        else:
            assert c.name == "torch.moe"
            assert ("moe_triton", "triton.moe", "needs cuda, this is cpu") in c.passed_over


def test_startup_slot_is_the_one_the_model_asks_for(tiny):
    p = plan(EngineConfig(model=str(tiny), device="cpu"), strict=False)
    model = load_model(tiny, "cpu")
    asked = {c.slot for c in model.factory.choices.values() if c.slot.startswith("moe[")}
    assert asked == {c.slot for c in p.choices if c.slot.startswith("moe[")} == {"moe[bf16/bf16 16x64x32]"}


class _Bank(torch.nn.Module):
    def __init__(self, kernel):
        super().__init__()
        self.kernel, self.moe_prepared = kernel, None


class _FakeMoeModel(torch.nn.Module):
    """What graphs_supported reads: device, dtype, graph_decode and the MoE banks' kernels."""

    graph_decode = True

    def __init__(self, kernel, dtype=torch.bfloat16):
        super().__init__()
        self.bank = _Bank(kernel)
        self.device, self.dtype = torch.device("cuda"), dtype


def test_decode_graph_only_with_a_graph_safe_moe_kernel():
    from ninfer_plugins.qwen_hybrid.layers import ReferenceMoe

    assert graphs_supported(_FakeMoeModel(TritonMoe()), cuda_graph=True) is None
    why = graphs_supported(_FakeMoeModel(ReferenceMoe()), cuda_graph=True)
    assert "torch.moe" in why and "host sync" in why
    # graph-safe, but this dtype runs the reference path
    assert "triton.moe" in graphs_supported(_FakeMoeModel(TritonMoe(), torch.float32), cuda_graph=True)
    assert TritonMoe.graph_safe and not getattr(ReferenceMoe, "graph_safe", False)
