"""--quant int8 / int4 / nvfp4 run a tiny model end to end on the CPU (reference kernels) and stay
close to the unquantized model (bench/quant_quality.py prints the full figures)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_dense(tmp_path_factory):
    from ninfer.testing import make_tiny

    return make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("tiny") / "m", seed=0, vocab=256)


@pytest.mark.slow
def test_quantized_tiny_models_track_the_reference(tiny_dense):
    from ninfer.testing import greedy_generate, load_model

    prompt = torch.randint(0, 256, (8,), generator=torch.Generator().manual_seed(1))

    def run(quant):
        m = load_model(tiny_dense, device="cpu", quant=quant)
        cache = m.allocate_cache(1, 9, "bf16")
        lp = torch.log_softmax(m.compute_logits(m.forward(prompt, cache, 0, 0)).float(), -1)
        return m, lp

    ref_model, ref = run("bf16")
    kl = {}
    for quant in ("int8", "int4", "nvfp4"):
        model, lp = run(quant)
        assert bool(torch.isfinite(lp).all())
        kl[quant] = float((ref.exp() * (ref - lp)).sum(-1).mean())
        if quant == "int4":
            tokens = greedy_generate(model, prompt[:4], 3)
            assert len(tokens) == 3 and all(0 <= t < 256 for t in tokens)
    # 8.5 bits per weight is near lossless; the 4-bit formats cost more but stay bounded
    assert kl["int8"] < 0.01
    assert kl["int8"] < kl["int4"] < 0.5 and kl["int8"] < kl["nvfp4"] < 0.5
