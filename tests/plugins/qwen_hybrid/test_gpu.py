"""The same model on CUDA: bf16 close to the fp32 CPU oracle, fp32 on CUDA equal to it."""

from __future__ import annotations

import pytest
import torch

from ninfer.testing import greedy_generate, load_model, make_tiny

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

VOCAB = 512


@pytest.fixture(scope="module", params=["qwen3.6-27b", "qwen3.6-35b-a3b"])
def tiny(request, tmp_path_factory):
    return make_tiny(request.param, tmp_path_factory.mktemp(request.param), vocab=VOCAB)


def _logits(model, ids, chunk):
    cache = model.allocate_cache(2, 256, "bf16")
    hidden = torch.cat([model.forward(ids[s : s + chunk], cache, 1, s) for s in range(0, len(ids), chunk)])
    return model.compute_logits(hidden).cpu()


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_bf16_and_fp32_on_cuda(tiny):
    ids = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(0))
    ref = _logits(load_model(tiny, "cpu"), ids, 200)
    fp32 = load_model(tiny, "cuda", dtype="float32")
    assert _rel(_logits(fp32, ids, 200), ref) < 1e-4
    assert _rel(_logits(fp32, ids, 64), ref) < 1e-4
    bf16 = load_model(tiny, "cuda")
    assert bf16.dtype == torch.bfloat16
    out = _logits(bf16, ids, 200)
    # bf16 flips near-tied top-k routing choices, so the MoE drifts more (transformers' own bf16
    # model is 0.15 away from its fp32 one on this checkpoint, 0.05 for the dense one)
    moe = bf16.shape.is_moe
    assert _rel(out, ref) < (0.3 if moe else 0.1)
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    # chunked prefill in bf16 (each chunk reads the bf16 cache and carries the GDN state between
    # chunks) is held to the same distance from the fp32 oracle as one whole prefill: the two bf16
    # runs round differently, and on the dense checkpoint they measured 0.053 apart on the H200,
    # the size of bf16's own error here
    chunked = _logits(bf16, ids, 48)
    assert _rel(chunked, ref) < (0.3 if moe else 0.1)
    assert (chunked.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    assert greedy_generate(fp32, ids[:64], 16, chunk=24) == greedy_generate(load_model(tiny, "cpu"), ids[:64], 16)


def test_decode_step_captures_in_a_cuda_graph(tiny):
    model = load_model(tiny, "cuda")
    cache = model.allocate_cache(4, 128, "bf16")
    for slot in range(4):
        model.forward(torch.randint(0, VOCAB, (10 + slot,), device="cuda"), cache, slot, 0)
    ids = torch.tensor([1, 2, 3, 4], device="cuda")
    slots = torch.arange(4, device="cuda")
    positions = torch.tensor([10, 11, 12, 13], device="cuda")
    snaps = [cache.snapshot(s) for s in range(4)]
    eager = model.decode(ids, cache, slots, positions, max_len=64)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture requires
        for s in range(4):
            cache.restore(s, snaps[s])
        model.decode(ids, cache, slots, positions, max_len=64)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model.decode(ids, cache, slots, positions, max_len=64)
    for s in range(4):
        cache.restore(s, snaps[s])
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager)
