"""The model's cache API, batched decode, weights (random, MTP, bad checkpoints), the backend seam
and the memory check."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer import hookimpl
from ninfer.config import EngineConfig
from ninfer.device import DeviceInfo, probe
from ninfer.errors import CheckpointError, UserError
from ninfer.plugins import get_plugin_manager
from ninfer.testing import load_model, make_tiny
from ninfer_plugins.qwen_hybrid.attention import ReferenceFullAttention
from ninfer_plugins.qwen_hybrid.plugin import ninfer_validate
from ninfer_plugins.qwen_hybrid.shape import parse_hf_config

VOCAB = 256


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("tiny27"), vocab=VOCAB, layers=4)


@pytest.fixture(scope="module")
def model(tiny):
    return load_model(tiny)


def _ids(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_batched_decode_equals_one_at_a_time(model):
    prompts = [_ids(n, s) for n, s in ((5, 1), (17, 2), (70, 3))]
    slots = [2, 0, 1]
    batch = model.allocate_cache(3, 96, "bf16")
    alone = model.allocate_cache(3, 96, "bf16")
    for slot, p in zip(slots, prompts):
        model.forward(p, batch, slot, 0)
        model.forward(p, alone, slot, 0)
    next_ids = torch.tensor([7, 8, 9])
    positions = torch.tensor([len(p) for p in prompts])
    together = model.decode(next_ids, batch, torch.tensor(slots), positions)
    for i, slot in enumerate(slots):
        one = model.decode(next_ids[i : i + 1], alone, torch.tensor([slot]), positions[i : i + 1])
        torch.testing.assert_close(together[i : i + 1], one, atol=1e-5, rtol=1e-5)


def test_one_token_chunks_equal_one_pass(model):
    ids = _ids(12, 10)
    whole = model.forward(ids, model.allocate_cache(1, 16), 0, 0)
    cache = model.allocate_cache(1, 16)
    steps = torch.cat([model.forward(ids[i : i + 1], cache, 0, i) for i in range(12)])
    torch.testing.assert_close(steps, whole, atol=1e-5, rtol=1e-5)


def test_snapshot_restore_rolls_back_recurrent_state(model):
    cache = model.allocate_cache(1, 64, "bf16")
    model.forward(_ids(20, 4), cache, 0, 0)
    snap = cache.snapshot(0)
    first = model.forward(torch.tensor([3, 4]), cache, 0, 20)
    model.forward(torch.tensor([9, 9, 9]), cache, 0, 22)  # a rejected draft
    cache.restore(0, snap)
    again = model.forward(torch.tensor([3, 4]), cache, 0, 20)
    torch.testing.assert_close(first, again)


def test_reset_forgets_the_previous_sequence(model):
    cache = model.allocate_cache(1, 64, "bf16")
    fresh = model.forward(_ids(10, 5), cache, 0, 0)
    model.forward(_ids(30, 6), cache, 0, 10)
    cache.reset(0)
    torch.testing.assert_close(model.forward(_ids(10, 5), cache, 0, 0), fresh)


def test_kv_formats_not_on_reference_path(model):
    # int8 (INT8-G64) is built: tests/plugins/cuda_fast/test_int8_kv.py
    with pytest.raises(UserError, match="kv-dtype bf16"):
        model.allocate_cache(1, 32, "fp8")


def test_context_overflow_is_a_user_error(model):
    cache = model.allocate_cache(1, 16, "bf16")
    with pytest.raises(UserError, match="max-context"):
        model.forward(_ids(20, 7), cache, 0, 0)


def test_random_weights_deterministic(tiny):
    shape = parse_hf_config(json.loads((tiny / "config.json").read_text()))
    pm = get_plugin_manager()
    cfg = EngineConfig(model="x", device="cpu", random_weights=True)
    a, b = (pm.hook.ninfer_model(shape=shape, config=cfg, device=probe("cpu"), weights=None) for _ in range(2))
    ids = _ids(9, 8)
    ha = a.forward(ids, a.allocate_cache(1, 16), 0, 0)
    hb = b.forward(ids, b.allocate_cache(1, 16), 0, 0)
    assert torch.equal(ha, hb) and torch.isfinite(a.compute_logits(ha)).all()


def test_mtp_weights_kept_aside(model):
    mtp = model.load_mtp_weights()
    assert mtp["mtp.fc.weight"].shape == (64, 128)
    assert "mtp.layers.0.self_attn.q_proj.weight" in mtp


def test_mtp_weights_per_expert_layout(tmp_path):
    fused = load_model(make_tiny("qwen3.6-35b-a3b", tmp_path / "f", vocab=64)).load_mtp_weights()
    per_expert = make_tiny("qwen3.6-35b-a3b", tmp_path / "p", vocab=64, expert_layout="per_expert")
    split = load_model(per_expert).load_mtp_weights()
    assert sorted(fused) == sorted(split)
    name = "mtp.layers.0.mlp.experts.gate_up_proj"
    assert fused[name].shape == (16, 64, 64) and torch.equal(fused[name], split[name])


def test_prequantized_source_hands_packed_weights(tiny):
    from ninfer.checkpoint import WeightSource
    from ninfer.linear import dense_weight

    class Packed(WeightSource):
        asked: list[str] = []

        def get_packed(self, name):
            if name.endswith("o_proj.weight"):
                self.asked.append(name)
                return dense_weight(self.get(name).float() * 0)
            return None

    pm = get_plugin_manager()
    shape = parse_hf_config(json.loads((tiny / "config.json").read_text()))
    cfg = EngineConfig(model=str(tiny), device="cpu")
    m = pm.hook.ninfer_model(shape=shape, config=cfg, device=probe("cpu"), weights=Packed(tiny))
    assert Packed.asked == ["model.language_model.layers.3.self_attn.o_proj.weight"]
    assert not m.layers[3].mixer.o_proj.prepared.any()


def _rewrite(src, dst, edit):
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_missing_tensor_is_named(tiny, tmp_path):
    name = "model.language_model.layers.2.linear_attn.A_log"
    bad = _rewrite(tiny, tmp_path / "bad", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=r"layers\.2\.linear_attn\.A_log") as e:
        load_model(bad)
    assert e.value.tensor == name


def test_wrong_shape_is_named(tiny, tmp_path):
    name = "model.language_model.layers.3.self_attn.k_proj.weight"

    def edit(t):
        t[name] = t[name][:-1].contiguous()

    bad = _rewrite(tiny, tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match=r"layers\.3\.self_attn\.k_proj\.weight has shape \[127, 64\]"):
        load_model(bad)


class _CountingFull(ReferenceFullAttention):
    name = "test.counting"
    calls = 0

    def prefill(self, *args, **kwargs):
        type(self).calls += 1
        return super().prefill(*args, **kwargs)


class _TunedPlugin:
    @hookimpl(tryfirst=True)
    def ninfer_attention_backend(self, kind, device, kv_dtype, head_dim):
        return _CountingFull() if kind == "full" else None


def test_tuned_attention_backend_replaces_reference(tiny):
    pm = get_plugin_manager()
    pm.register(_TunedPlugin(), name="test-tuned-attention")
    try:
        m = load_model(tiny)
        assert m.backend_choices["full"].name == "test.counting"
        assert m.backend_choices["linear"].name == "torch.gated_delta_rule"
        m.forward(_ids(4, 9), m.allocate_cache(1, 8), 0, 0)
        assert _CountingFull.calls == 1  # one full-attention layer in 4
    finally:
        pm.unregister("test-tuned-attention")


def _gpu(gib):
    return DeviceInfo("cuda", 0, "test GPU", (9, 0), gib * 2**30, gib * 2**30, 132, frozenset({"bf16"}))


def test_validate_memory(tiny):
    from ninfer_plugins.qwen36_27b.plugin import SHAPE
    from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape

    big = QwenHybridShape(**SHAPE)
    cfg = EngineConfig(model="qwen3.6-27b", quant="bf16", max_context=8192, max_batch=1)
    problems = ninfer_validate(_gpu(32), cfg, big)
    assert len(problems) == 1 and "--quant" in problems[0] and "--max-context" in problems[0]
    assert ninfer_validate(_gpu(141), cfg, big) == []
    assert ninfer_validate(_gpu(32), EngineConfig(model="x", quant="int4", max_context=8192, max_batch=1), big) == []
    assert ninfer_validate(_gpu(24), EngineConfig(model="x", quant="int4", max_context=262144, max_batch=4), big)
    assert ninfer_validate(_gpu(32), cfg, None) == []


def test_model_is_freed_without_gc(tiny):
    import gc
    import weakref

    gc.disable()
    try:
        m = load_model(tiny)
        ref = weakref.ref(m)
        del m
        assert ref() is None  # no reference cycle keeps GPU memory alive until a gc pass
    finally:
        gc.enable()


def test_decode_with_max_len_bound(model):
    cache = model.allocate_cache(2, 64)
    model.forward(_ids(10, 11), cache, 0, 0)
    model.forward(_ids(20, 12), cache, 1, 0)
    snap = [cache.snapshot(s) for s in (0, 1)]
    args = (torch.tensor([5, 6]), cache, torch.tensor([0, 1]), torch.tensor([10, 20]))
    free = model.decode(*args)
    for s in (0, 1):
        cache.restore(s, snap[s])
    torch.testing.assert_close(model.decode(*args, max_len=48), free)


def test_gathered_experts_equal_the_loop(tmp_path):
    m = load_model(make_tiny("qwen3.6-35b-a3b", tmp_path / "moe", vocab=64))
    bank = m.layers[0].mlp.experts
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=gen)
    ids = torch.stack([torch.randperm(16, generator=gen)[:4] for _ in range(6)])
    w = torch.softmax(torch.randn(6, 4, generator=gen), -1)
    gathered = bank(x, ids, w)
    stacked, bank.stacked = bank.stacked, {}
    try:
        torch.testing.assert_close(gathered, bank(x, ids, w), atol=1e-5, rtol=1e-5)
    finally:
        bank.stacked = stacked
