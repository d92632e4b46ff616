"""CUDA-graph decode: buckets, when graphs are used, and (on a GPU) the same tokens as eager."""

from __future__ import annotations

import pytest
import torch

from ninfer.config import EngineConfig, SamplingParams
from ninfer.graphs import StepInputs, buckets_for, graphs_supported
from ninfer.testing import load_model, make_tiny

VOCAB = 512
CUDA = torch.cuda.is_available()


def test_buckets_exact_then_multiples_of_16():
    assert buckets_for(1) == [1]
    assert buckets_for(8) == list(range(1, 9))
    assert buckets_for(40) == list(range(1, 17)) + [32, 48]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_step_inputs_one_copy_of_ints_and_floats(device):
    """StepInputs: the int64 and float32 rows are views of one device buffer, written from one
    staging buffer; a narrower write changes only its columns, a second write before any sync
    still lands (the staging buffer waits for the first copy), too many columns is an error."""
    inp = StepInputs(3, 2, 4, torch.device(device))
    assert inp.ints.shape == (3, 4) and inp.floats.shape == (2, 4)
    assert inp.ints.dtype == torch.int64 and inp.floats.dtype == torch.float32
    inp.write([[1, 2, 3, 4], [5, 6, 7, 8], [-1, 2**40, 0, 9]], [[0.5, 1.5, -2.0, 3.25], [1e-3, 0.0, 7.0, 8.0]])
    inp.write([[10, 20], [30, 40], [50, 60]], [[0.25, 0.75], [2.0, 4.0]])
    assert inp.ints.cpu().tolist() == [[10, 20, 3, 4], [30, 40, 7, 8], [50, 60, 0, 9]]
    assert inp.floats.cpu().tolist() == [[0.25, 0.75, -2.0, 3.25], [2.0, 4.0, 7.0, 8.0]]
    inp.ints[1, 3] = 99  # the views are the device buffer itself (graphs read them in place)
    assert int(inp._device[: 3 * 4 * 8].view(torch.int64)[7]) == 99
    with pytest.raises(ValueError, match="5 columns"):
        inp.write([[0] * 5] * 3, [[0.0] * 5] * 2)


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quant", ["bf16", "int4"])
def test_graph_steps_launched_ahead_give_the_same_tokens(tmp_path, monkeypatch, quant):
    """NINFER_LOOKAHEAD=1 with CUDA graphs: each step also replays the batch's next step (ids fed
    from the device, the history counts already holding the previous token) before the host reads
    its tokens. Same tokens as plain graph steps: greedy, a stop token (the host sees it a step
    late), staggered arrivals and lengths (the batch changes under a step run ahead), sampling
    with penalties."""
    from ninfer.startup import build_engine
    from test_lookahead import count_launches_ahead  # same folder: pytest puts it on sys.path

    path = make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (9, 30, 17, 5)]
    params = [
        SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_new_tokens=25),  # may meet a stop token
        SamplingParams(temperature=0.8, top_k=10, presence_penalty=1.0, frequency_penalty=0.5, seed=5, max_new_tokens=16,
                       ignore_eos=True),
        SamplingParams(temperature=0.7, seed=9, max_new_tokens=7, ignore_eos=True),
    ]
    launched = count_launches_ahead(monkeypatch)
    outputs = {}
    for ahead in (False, True):
        monkeypatch.setenv("NINFER_LOOKAHEAD", "1" if ahead else "0")
        cfg = EngineConfig(model=str(path), device="cuda", max_context=128, max_batch=4, cuda_graph=True, quant=quant)
        engine = build_engine(cfg)
        assert engine.runner.graphs is not None and engine.runner.lookahead == ahead
        rids, tokens, step = [], {}, 0
        while len(rids) < len(prompts) or engine.has_unfinished():
            if len(rids) < len(prompts) and step % 5 == 0:  # one arrival every few steps
                rids.append(engine.add_request(prompts[len(rids)], params[len(rids)]))
                tokens[rids[-1]] = []
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
            step += 1
        outputs[ahead] = [tokens[rid] for rid in rids]
    assert sum(launched) > 0
    assert outputs[True] == outputs[False]
