"""CUDA-graph decode: buckets, when graphs are used, and (on a GPU) the same tokens as eager."""

from __future__ import annotations

import pytest
import torch

from ninfer.config import EngineConfig, SamplingParams
from ninfer.graphs import buckets_for, graphs_supported
from ninfer.testing import load_model, make_tiny

VOCAB = 512
CUDA = torch.cuda.is_available()


def test_buckets_exact_then_multiples_of_16():
    assert buckets_for(1) == [1]
    assert buckets_for(8) == list(range(1, 9))
    assert buckets_for(40) == list(range(1, 17)) + [32, 48]


def test_graphs_only_where_the_model_allows(tmp_path):
    model = load_model(make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4), "cpu")
    assert graphs_supported(model, cuda_graph=False) == "--no-cuda-graph"
    assert graphs_supported(model, cuda_graph=True) == "not on a CUDA device"

    class Fake:
        device = torch.device("cuda")
        graph_decode = False

    assert "host sync" in graphs_supported(Fake(), cuda_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize(
    "kv_dtype,quant,pdl",
    [("bf16", "bf16", False), ("int8", "bf16", False), ("bf16", "int4", False), ("bf16", "nvfp4", False),
     ("bf16", "bf16", True), ("int8", "int4", True), ("bf16", "nvfp4", True)],
)
def test_graph_and_eager_give_the_same_tokens(tmp_path, monkeypatch, kv_dtype, quant, pdl):
    """Also with quantized weights (merged projections, the GEMV, the split-K MMA kernel's
    workspace inside a captured step) and with programmatic dependent launch (NINFER_PDL=1: the
    Triton kernels of a step may start before their predecessor ends, waiting in-kernel)."""
    monkeypatch.setenv("NINFER_PDL", "1" if pdl else "0")
    from ninfer.startup import build_engine

    path = make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4)
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 30, 17)]
    params = [
        SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True),
        # sampled with penalties: the graph's device-side history counts must equal the eager sampler's
        SamplingParams(temperature=0.8, top_k=10, presence_penalty=1.0, frequency_penalty=0.5, seed=5, max_new_tokens=16, ignore_eos=True),
    ]
    outputs = {}
    for graph in (True, False):
        cfg = EngineConfig(model=str(path), device="cuda", max_context=128, max_batch=4, kv_dtype=kv_dtype, cuda_graph=graph, quant=quant)
        engine = build_engine(cfg)
        assert (engine.runner.graphs is not None) == graph
        rids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        tokens = {rid: [] for rid in rids}
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        outputs[graph] = [tokens[rid] for rid in rids]
        if graph:
            # the three requests decoded together at some step: that batch size was captured
            assert 3 in engine.runner.graphs.graphs
    assert outputs[True] == outputs[False]
