"""The launch folds (NINFER_GDN_AB, on by default; NINFER_MOE_NORM and NINFER_GEMV_NORM, the f16x2
GEMV and the MoE pair down kernel, off: slower on the H200) in a whole model on the GPU: graph and
eager decode give the same tokens with them on, and the logits stay close to the unfolded ones.

The tiny checkpoints are too narrow for the kernels the folds live in (the f16x2 GEMV and the
pair kernels want K a multiple of 256), so these tests write a "medium" one of the same layout
(ninfer.testing.make_medium: hidden 1,024, head dims 256 / 128, 4 layers), int4. The CPU part
checks that checkpoint loads."""

from __future__ import annotations

import pytest
import torch

from ninfer.config import EngineConfig, SamplingParams
from ninfer.testing import load_model, make_medium

CUDA = torch.cuda.is_available()
FOLDS = ("NINFER_GDN_AB", "NINFER_MOE_NORM", "NINFER_GEMV_NORM")


@pytest.mark.parametrize("like", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_the_medium_checkpoint_loads_and_runs(tmp_path, like):
    model = load_model(make_medium(like, tmp_path / like), "cpu")
    assert model.shape.hidden_size == 1024
    cache = model.allocate_cache(1, 32)
    h = model.forward(torch.tensor([1, 2, 3]), cache, 0, 0)
    assert h.shape == (3, 1024) and bool(torch.isfinite(model.compute_logits(h)).all())


def _tokens(path, graph: bool) -> list[list[int]]:
    from ninfer.startup import build_engine

    cfg = EngineConfig(model=path, device="cuda", max_context=128, max_batch=2, cuda_graph=graph, quant="int4")
    engine = build_engine(cfg)
    assert (engine.runner.graphs is not None) == graph
    prompts = [[5, 9, 17, 3, 44, 2, 8], [7, 1, 99]]
    rids = [engine.add_request(p, SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)) for p in prompts]
    out = {rid: [] for rid in rids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    return [out[r] for r in rids]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("like", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_gpu_folds_give_graph_equal_eager(tmp_path, monkeypatch, like):
    path = make_medium(like, tmp_path / like)
    for name in FOLDS:
        monkeypatch.setenv(name, "1")
    assert _tokens(path, graph=True) == _tokens(path, graph=False)


def _decode_logits(model, prompt: torch.Tensor, steps: int = 3) -> torch.Tensor:
    """Prefill `prompt` into slot 0, then `steps` decode steps: their logits, stacked."""
    cache = model.allocate_cache(1, 32)
    model.forward(prompt, cache, 0, 0)
    outs = []
    for step in range(steps):
        h = model.decode(torch.tensor([11 + step], device="cuda"), cache, torch.tensor([0], device="cuda"),
                         torch.tensor([len(prompt) + step], device="cuda"))
        outs.append(model.compute_logits(h))
    return torch.cat(outs)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("like", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_gpu_folds_keep_the_logits(tmp_path, monkeypatch, request, like):
    """Decode logits with every fold on against every fold off, same int4 model: close (the gates
    stay fp32 in the GDN step, the folded norms sum their squares in another order)."""
    # the GEMV's add + norm fold is the f16x2 GEMV's: where the CUDA GEMV has a measured winner for a
    # mixer's output projection (the 35B's q8 2048x4096 since the thirty-seventh session) it takes the
    # launch and the MoE's own fold runs instead, which would change the counts below
    triton_gemvs = pytest.MonkeyPatch()
    triton_gemvs.setenv("NINFER_CU_GEMV", "0")  # kept through monkeypatch.undo() below
    request.addfinalizer(triton_gemvs.undo)
    path = make_medium(like, tmp_path / like)
    model = load_model(path, "cuda", quant="int4")
    prompt = torch.tensor([5, 9, 17, 3, 44, 2, 8], device="cuda")

    monkeypatch.setenv("NINFER_GDN_AB", "0")
    plain = _decode_logits(model, prompt)
    monkeypatch.undo()
    moe = like == "qwen3.6-35b-a3b"
    # 3 decode steps x (3 GDN layers; 4 mixers; 4 MLPs or MoEs). The MoE folds the post-mixer
    # add + norm only where the mixer's GEMV did not already; its pair down kernel the one after.
    # The dense MLP's down_proj takes silu(gate) * up in its launch (NINFER_GEMV_GATED, on by
    # default) and then not the add + norm: only the 4 mixers' output GEMVs fold it.
    for names, want in ((("NINFER_GDN_AB", "NINFER_MOE_NORM"), {"gdn_ab": 9, **({"moe_norm": 12} if moe else {})}),
                        (FOLDS, {"gdn_ab": 9, "gemv_norm": 12, **({"moe_down_norm": 12} if moe else {})})):
        for name in names:
            monkeypatch.setenv(name, "1")
        seen = _spy_on_the_folds(monkeypatch)
        folded = _decode_logits(model, prompt)
        monkeypatch.undo()
        assert float((folded - plain).norm() / plain.norm()) < 2e-2, names
        assert seen == want, names


EARLY = ("NINFER_GDN_EARLY", "NINFER_MOE_EARLY")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("like", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_gpu_early_loads_change_no_bit_and_keep_graph_equal_eager(tmp_path, monkeypatch, like):
    """The reads before the PDL wait that launch.late_dependents allows (the GDN step's state,
    NINFER_GDN_EARLY; the MoE pair down kernel's ids and weights, NINFER_MOE_EARLY): the same
    arithmetic, so the same logits to the bit, eager; and graph decode gives eager's tokens."""
    path = make_medium(like, tmp_path / like)
    model = load_model(path, "cuda", quant="int4")
    prompt = torch.tensor([5, 9, 17, 3, 44, 2, 8], device="cuda")
    for name in EARLY:
        monkeypatch.setenv(name, "0")
    plain = _decode_logits(model, prompt)
    for name in EARLY:
        monkeypatch.setenv(name, "1")
    early = _decode_logits(model, prompt)
    assert torch.equal(early, plain)
    del model
    assert _tokens(path, graph=True) == _tokens(path, graph=False)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("like", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_gpu_pairs_from_the_norm_change_no_bit(tmp_path, monkeypatch, like):
    """NINFER_KW_XREUSE=1 (with NINFER_KW=1, so the K-walk GEMV serves every decode launch it fits
    at these widths): the norms before K-walk GEMVs write the GEMV's x pairs (gemv_kw.norm_pairs)
    and those GEMVs skip their own x-pairs launch; the same pairs, so the same logits to the bit,
    and graph decode gives eager's tokens."""
    path = make_medium(like, tmp_path / like)
    monkeypatch.setenv("NINFER_KW", "1")
    monkeypatch.setenv("NINFER_NORM_PAIRS", "0")  # the spread form (the default) would take these norms
    _norms_make_pairs(path, monkeypatch, "norm_pairs", "NINFER_KW_XREUSE")


def _norms_make_pairs(path, monkeypatch, norm_fn: str, switch: str, gdn_pairs: bool = False) -> None:
    """With `switch`=1 the norms run gemv_kw.<norm_fn> (none without), the x-pairs launches fall
    by at least as many, the decode logits stay equal to the bit, and graph decode gives eager's
    tokens. No GDN decode step is given out_proj's pairs without it; gdn_pairs: some are with it."""
    import ninfer.kernels.triton as T
    from ninfer_plugins.quant_int import gemv_kw

    model = load_model(path, "cuda", quant="int4")
    prompt = torch.tensor([5, 9, 17, 3, 44, 2, 8], device="cuda")
    plain = _decode_logits(model, prompt)
    calls = {"norm": 0, "pairs": 0}

    def count(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(gemv_kw, norm_fn, count("norm", getattr(gemv_kw, norm_fn)))
    monkeypatch.setattr(gemv_kw, "xpairs", count("pairs", gemv_kw.xpairs))
    step = T.gdn_decode_step
    calls["gdn_pairs"] = 0

    def gdn_step(*args, **kwargs):
        calls["gdn_pairs"] += kwargs.get("out_pairs") is not None
        return step(*args, **kwargs)

    monkeypatch.setattr(T, "gdn_decode_step", gdn_step)
    _decode_logits(model, prompt, steps=1)
    without = dict(calls)
    monkeypatch.setenv(switch, "1")
    calls.update(norm=0, pairs=0, gdn_pairs=0)
    _decode_logits(model, prompt, steps=1)
    assert without["norm"] == 0 and calls["norm"] > 0, (without, calls)
    assert without["gdn_pairs"] == 0 and (calls["gdn_pairs"] > 0 or not gdn_pairs), (without, calls)
    assert calls["pairs"] <= without["pairs"] - calls["norm"] - calls["gdn_pairs"], (without, calls)
    assert torch.equal(_decode_logits(model, prompt), plain)
    del model
    assert _tokens(path, graph=True) == _tokens(path, graph=False)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("like", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
@pytest.mark.parametrize("gemv", ["NINFER_KW", "NINFER_CU_GEMV"])
def test_gpu_spread_norm_pairs_change_no_bit(tmp_path, monkeypatch, like, gemv):
    """NINFER_NORM_PAIRS (on by default) against =0, with the K-walk (NINFER_KW=1) or the CUDA GEMV (NINFER_CU_GEMV=4) on
    every decode launch it fits: the norms before those GEMVs make their x pairs over every K block
    (gemv_kw.norm_pairs_spread), the residual sum in a new tensor, and the GEMVs skip their own
    x-pairs launch; the same norm and pairs, so the same logits to the bit, and graph decode gives
    eager's tokens."""
    monkeypatch.setenv("NINFER_NORM_PAIRS", "0")  # "without" first: the switch is on by default
    monkeypatch.setenv("NINFER_CU_GEMV", "4" if gemv == "NINFER_CU_GEMV" else "0")
    if gemv == "NINFER_KW":
        monkeypatch.setenv("NINFER_KW", "1")
    else:
        from ninfer_plugins.quant_int import gemv_cu

        if gemv_cu.unavailable(torch.device("cuda")):
            pytest.skip(gemv_cu.unavailable(torch.device("cuda")))
    # the CUDA GEMV takes every 1-4 row launch with K a multiple of 128, out_proj's included
    _norms_make_pairs(make_medium(like, tmp_path / like), monkeypatch, "norm_pairs_spread", "NINFER_NORM_PAIRS",
                      gdn_pairs=gemv == "NINFER_CU_GEMV")


def _spy_on_the_folds(monkeypatch) -> dict[str, int]:
    import ninfer.kernels.triton as T
    from ninfer_plugins.moe_triton import moe as M
    from ninfer_plugins.moe_triton import pair_gemv as PG
    from ninfer_plugins.quant_int import gemv_h2

    seen: dict[str, int] = {}

    def spy(module, name, key, folded):
        orig = getattr(module, name)

        def wrapper(*args, **kwargs):
            if folded(args, kwargs):
                seen[key] = seen.get(key, 0) + 1
            return orig(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    spy(T, "gdn_decode_step", "gdn_ab", lambda a, kw: kw.get("ab_input") is not None)
    spy(gemv_h2, "launch", "gemv_norm", lambda a, kw: kw.get("add_norm") is not None)
    spy(M, "route_gemv", "moe_norm", lambda a, kw: kw.get("add_norm") is not None)
    spy(PG, "down", "moe_down_norm", lambda a, kw: kw.get("add_norm") is not None)
    return seen


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_gated_down_projection_in_the_model(tmp_path, monkeypatch):
    """The dense MLP's silu(gate) * up inside down_proj's f16x2 GEMV (the default). Decode
    logits bit-equal to silu_mul then the GEMV (same x values, same kernel), every MLP of every
    decode step folded; graph and eager decode give the same tokens."""
    from ninfer_plugins.quant_int import gemv_h2

    path = make_medium("qwen3.6-27b", tmp_path / "m27")
    model = load_model(path, "cuda", quant="int4")
    prompt = torch.tensor([5, 9, 17, 3, 44, 2, 8], device="cuda")

    monkeypatch.setenv("NINFER_GEMV_GATED", "0")
    plain = _decode_logits(model, prompt)
    monkeypatch.delenv("NINFER_GEMV_GATED")
    seen, orig = [], gemv_h2.launch

    def spy(*args, **kwargs):
        seen.append(bool(kwargs.get("gated")))
        return orig(*args, **kwargs)

    monkeypatch.setattr(gemv_h2, "launch", spy)
    assert torch.equal(_decode_logits(model, prompt), plain)
    assert sum(seen) == 3 * 4  # 3 decode steps x 4 dense MLPs
    monkeypatch.setattr(gemv_h2, "launch", orig)
    assert _tokens(path, graph=True) == _tokens(path, graph=False)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_q5_words_change_no_bit_in_the_model(tmp_path, monkeypatch):
    """q5's prepared high-bit words (gemv_cu.q5_words) in a whole model: every 1-4 row launch on the
    CUDA GEMV (NINFER_CU_GEMV=4) and words made at load for every q5 weight it may serve
    (NINFER_Q5_WORDS=1). Decode logits are bit-equal to the same launches on the runs of qhigh
    (NINFER_Q5_WORDS=0, read at each launch), some launches read words, and graph decode gives
    eager's tokens."""
    from ninfer_plugins.quant_int import gemv_cu

    why = gemv_cu.unavailable(torch.device("cuda"))
    if why:
        pytest.skip(why)
    monkeypatch.setenv("NINFER_CU_GEMV", "4")
    monkeypatch.setenv("NINFER_Q5_WORDS", "1")
    monkeypatch.setenv("NINFER_CU_CARD", "0")  # DEFAULT configs at every shape, no card's winners
    monkeypatch.delenv("NINFER_CU_TUNED", raising=False)
    path = make_medium("qwen3.6-27b", tmp_path / "m27")
    model = load_model(path, "cuda", quant="int4")
    prompt = torch.tensor([5, 9, 17, 3, 44, 2, 8], device="cuda")
    read, orig = [], gemv_cu._with_words

    def spy(p, cfg, m):
        out = orig(p, cfg, m)
        read.append(out[1] is not None)
        return out

    monkeypatch.setattr(gemv_cu, "_with_words", spy)
    with_words = _decode_logits(model, prompt)
    assert any(read), "no launch read the words"
    monkeypatch.setenv("NINFER_Q5_WORDS", "0")
    read.clear()
    assert torch.equal(_decode_logits(model, prompt), with_words)
    assert read and not any(read)
    monkeypatch.setenv("NINFER_Q5_WORDS", "1")
    del model
    assert _tokens(path, graph=True) == _tokens(path, graph=False)
