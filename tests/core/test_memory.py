"""The memory plan: sizes from the shape and the quantization recipe, and the refusal before load."""

from __future__ import annotations

import pytest

from ninfer.config import EngineConfig
from ninfer.device import DeviceInfo
from ninfer.errors import DeviceError
from ninfer.memory import BUSY_PREFILL_CHUNK, GIB, check_memory, choose_prefill_chunk, plan_memory
from ninfer.plugins import get_plugin_manager
from ninfer_plugins.qwen36_27b.plugin import SHAPE
from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape

BIG = QwenHybridShape(**SHAPE)


def _gpu(gib: float) -> DeviceInfo:
    return DeviceInfo("cuda", 0, "Fake GPU", (9, 0), int(gib * GIB), int(gib * GIB), 132, frozenset({"cuda", "bf16", "triton"}))


def _plan(gib: float, **cfg):
    cfg.setdefault("model", "qwen3.6-27b")
    return plan_memory(BIG, EngineConfig(**cfg), _gpu(gib), get_plugin_manager(), None)


def test_weights_follow_the_recipe():
    bf16 = _plan(141, quant="bf16", max_context=8192, max_batch=1)
    int4 = _plan(141, quant="int4", max_context=8192, max_batch=1)
    int8 = _plan(141, quant="int8", max_context=8192, max_batch=1)
    # 26.9 B parameters: bf16 2 bytes each; int4 mixes q4/q5/q6 (4.25-6.25 bits) and keeps the
    # embedding table and a/b projections in bf16; int8 is q8_g32 (8.5 bits)
    assert 49 < bf16.weights / GIB < 51
    assert 15 < int4.weights / GIB < 18.5
    assert 26 < int8.weights / GIB < 29
    assert int4.kv == bf16.kv == 8192 * BIG.kv_bytes_per_token("bf16")


def test_kv_and_state_scale_with_context_and_slots():
    one = _plan(141, quant="int4", max_context=131072, max_batch=1, kv_dtype="int8")
    four = _plan(141, quant="int4", max_context=131072, max_batch=4, kv_dtype="int8")
    assert four.kv == 4 * one.kv and four.state == 4 * one.state
    # INT8-G64: 1 byte + a 2-byte scale per 64 elements, 16 layers x 4 heads x 256 x (K, V)
    assert one.kv == 131072 * 16 * 2 * 4 * (256 + 8)
    # the bar: the 27B at int4 with a 131,072-token INT8 context fits 32 GiB (with the
    # default prefill chunk chosen for that card: on 141 GiB it takes 16,384 tokens, 33.9 GiB)
    small = _plan(32, quant="int4", max_context=131072, max_batch=1, kv_dtype="int8")
    assert small.total < 32 * GIB and small.fits


def test_default_prefill_chunk_is_the_largest_that_fits():
    """--prefill-chunk's default (0) on CUDA: 16384 where it fits, capped at --max-context, smaller
    where the workspace would not fit beside the weights and cache; 1024 on the CPU."""
    pm = get_plugin_manager()

    def chunk(gib, device=None, **cfg):
        cfg = EngineConfig(model="qwen3.6-27b", quant="int4", max_batch=1, **cfg)
        return choose_prefill_chunk(BIG, cfg, device or _gpu(gib), pm, None)

    assert chunk(141, max_context=32768) == 16384
    assert chunk(141, max_context=4096) == 4096  # never longer than a sequence
    # a 131,072-token INT8 cache: 8192 tokens' activations fit 32 GiB beside it (28.1 GiB in all),
    # not 26 GiB, where 4096 does
    assert chunk(32, max_context=131072, kv_dtype="int8") == 8192
    assert chunk(26, max_context=131072, kv_dtype="int8") == 4096
    # nothing fits: the smallest, and the plan names the problem
    assert chunk(8, max_context=8192) == 1024
    cpu = DeviceInfo("cpu", None, "CPU", None, 64 * GIB, 64 * GIB, 8, frozenset({"cpu"}))
    assert chunk(0, device=cpu, max_context=32768) == 1024
    assert chunk(0, device=cpu, max_context=256) == 256
    # plan_memory plans a default config at the chunk it resolves to
    auto = plan_memory(BIG, EngineConfig(model="qwen3.6-27b", quant="int4", max_batch=1, max_context=32768),
                       _gpu(141), pm, None)
    fixed = plan_memory(BIG, EngineConfig(model="qwen3.6-27b", quant="int4", max_batch=1, max_context=32768,
                                          prefill_chunk=16384), _gpu(141), pm, None)
    assert auto == fixed


def test_startup_resolves_the_busy_chunk(monkeypatch):
    """--prefill-chunk-busy's default (0) is the smaller of BUSY_PREFILL_CHUNK and the resolved
    --prefill-chunk; a larger value is cut to the chunk."""
    from ninfer import startup

    def chunks(device, **cfg):
        monkeypatch.setattr(startup, "probe", lambda spec: device)
        cfg = EngineConfig(model="qwen3.6-27b", quant="int4", max_batch=1, random_weights=True, **cfg)
        p = startup.plan(cfg)
        return p.config.prefill_chunk, p.config.prefill_chunk_busy

    assert BUSY_PREFILL_CHUNK == 2048
    gpu = _gpu(141)
    assert chunks(gpu, max_context=32768) == (16384, 2048)
    assert chunks(gpu, max_context=32768, prefill_chunk_busy=4096) == (16384, 4096)
    assert chunks(gpu, max_context=32768, prefill_chunk_busy=65536) == (16384, 16384)
    assert chunks(gpu, max_context=32768, prefill_chunk=512) == (512, 512)
    # the CPU path holds int4 weights as fp32 copies too (~115 GiB for the 27B)
    cpu = DeviceInfo("cpu", None, "CPU", None, 256 * GIB, 256 * GIB, 8, frozenset({"cpu"}))
    assert chunks(cpu, max_context=4096) == (1024, 1024)


def test_refusal_names_the_knobs():
    cfg = EngineConfig(model="qwen3.6-27b", quant="int4", max_context=262144, max_batch=4)
    plan = plan_memory(BIG, cfg, _gpu(32), get_plugin_manager(), None)
    assert not plan.fits
    with pytest.raises(DeviceError) as err:
        check_memory(plan, cfg)
    msg = err.value.message
    assert "--max-context" in msg and "--kv-dtype" in msg and "32.0 GiB" in msg
    assert msg.count(". ") == 0  # one sentence


def test_startup_plan_refuses_before_loading(monkeypatch):
    import ninfer.startup as startup

    monkeypatch.setattr(startup, "probe", lambda spec: _gpu(24))
    cfg = EngineConfig(model="qwen3.6-27b", quant="bf16", max_context=8192, max_batch=1, random_weights=True)
    with pytest.raises(DeviceError, match="--max-context"):
        startup.plan(cfg)
    ok = startup.plan(cfg, strict=False)
    assert ok.memory is not None and not ok.memory.fits and ok.problems[0] == ok.memory.problem(cfg)


def test_a_reused_models_memory_counts_as_free(monkeypatch):
    """A benchmark campaign builds the model once and plans each run again: the weights it holds
    are not free on the card but must not be counted twice (the bf16 27B on an 80 GiB H100 was
    refused with 15 GiB free)."""
    import ninfer.startup as startup

    def busy_h100(spec):  # 79 GiB, 50 GiB of it already this process's (the bf16 27B's weights)
        card = _gpu(79)
        return DeviceInfo(card.kind, card.index, "Fake H100", card.capability, card.total_memory,
                          card.total_memory - 50 * GIB, card.sm_count, card.features)

    monkeypatch.setattr(startup, "probe", busy_h100)
    cfg = EngineConfig(model="qwen3.6-27b", quant="bf16", max_context=8192, max_batch=1, random_weights=True)
    with pytest.raises(DeviceError, match="29.0 GiB free"):
        startup.plan(cfg)
    p = startup.plan(cfg, held_bytes=50 * GIB)
    assert p.memory.fits and p.memory.available == 79 * GIB
    # never more than the card: a credit past its size is capped
    assert startup.plan(cfg, held_bytes=500 * GIB).memory.available == 79 * GIB


def test_cpu_parity_path_counts_fp32():
    cpu = DeviceInfo("cpu", None, "cpu", None, 64 * GIB, 64 * GIB, 8, frozenset({"fp32", "bf16"}))
    cfg = EngineConfig(model="x", quant="bf16", max_context=4096, max_batch=1)
    plan = plan_memory(BIG, cfg, cpu, get_plugin_manager(), None)
    assert plan.kv == 2 * 4096 * BIG.kv_bytes_per_token("bf16")  # "bf16" KV is fp32 on the CPU path
    assert plan.weights > 99 * GIB


def test_cpu_plan_counts_the_reference_kernels_fp32_copies():
    """On the CPU the int kernels dequantize every weight once into an fp32 copy and keep the
    packed one beside it: the plan counts both, and a 27B int4 on a 64 GiB machine is refused at
    once (before, the plan counted 4.25-6.25 bits a weight, said it fit, and the build ground on
    until the machine ran out of memory)."""
    cpu = DeviceInfo("cpu", None, "CPU", None, 64 * GIB, 64 * GIB, 8, frozenset({"cpu"}))
    cfg = EngineConfig(model="qwen3.6-27b", quant="int4", max_context=4096, max_batch=1)
    on_cpu = plan_memory(BIG, cfg, cpu, get_plugin_manager(), None)
    on_gpu = _plan(141, quant="int4", max_context=4096, max_batch=1)
    recipe = get_plugin_manager().hook.ninfer_quant_recipe(quant="int4", shape=BIG, spec=None)
    quantized = sum(n * k for name, n, k in BIG.linear_shapes() if recipe.scheme_for(name, n, k) != "bf16")
    assert 0.95 * BIG.param_count() < quantized < BIG.param_count()
    assert on_gpu.copies == 0
    assert on_cpu.copies == quantized * 4
    # a quantized linear: its packed bytes on either device, plus the fp32 copy on the CPU; the rest
    # (embedding, norms, bf16-kept projections) in bf16 on the GPU and fp32 on the CPU
    rest = BIG.param_count() - quantized
    assert on_cpu.weights - on_cpu.copies - rest * 4 == on_gpu.weights - rest * 2
    assert not on_cpu.fits
    problem = on_cpu.problem(cfg)
    assert "fp32 copies" in problem and "run on a GPU" in problem
    assert "fp32 copies" not in (plan_memory(BIG, EngineConfig(model="x", quant="bf16", max_context=4096, max_batch=1),
                                             cpu, get_plugin_manager(), None).problem(cfg) or "")


def test_plugin_workspace_counts_the_grouped_moe_prefill(monkeypatch):
    """moe_triton declares the grouped prefill's kept bf16 experts through ninfer_workspace_bytes
    when the switch is on (and the chunk reaches it); the plan's workspace grows by that much."""
    from ninfer_plugins.moe_triton import prefill_grouped as G
    from ninfer_plugins.qwen36_35b_a3b.plugin import SHAPE as MOE

    shape = QwenHybridShape(**MOE)

    def plan(**cfg):
        cfg = dict(model="qwen3.6-35b-a3b", max_context=16384, max_batch=1, **cfg)
        return plan_memory(shape, EngineConfig(**cfg), _gpu(141), get_plugin_manager(), None)

    monkeypatch.setenv("NINFER_MOE_PREFILL", "tiles")
    off = plan(quant="int4", prefill_chunk=8192)
    monkeypatch.delenv("NINFER_MOE_PREFILL")  # the default: grouped
    on = plan(quant="int4", prefill_chunk=8192)
    want = G.scratch_bytes(256, 512, 2048, 8192, 8)
    assert on.workspace - off.workspace == want
    assert 1.5 * GIB < want < 2.5 * GIB  # 1.5 GB of experts + ~0.7 GB of sorted activations
    # a chunk below the grouped path's threshold never takes it; bf16 weights never either
    small_on = plan(quant="int4", prefill_chunk=4096)
    monkeypatch.setenv("NINFER_MOE_PREFILL", "tiles")
    assert small_on.workspace == plan(quant="int4", prefill_chunk=4096).workspace
    monkeypatch.delenv("NINFER_MOE_PREFILL")
    bf16_on = plan(quant="bf16", prefill_chunk=8192)
    monkeypatch.setenv("NINFER_MOE_PREFILL", "tiles")
    assert bf16_on.workspace == plan(quant="bf16", prefill_chunk=8192).workspace


def test_spec_mtp_counts_the_verify_rollback(monkeypatch):
    """--spec mtp K=3 on the GPU: by default (NINFER_GDN_REPLAY) the verify keeps each token's conv
    state and rank-1 update (g, k, delta), not the whole recurrent state after it (3.1 MB a layer
    on the 27B); with NINFER_GDN_REPLAY=0, and on the CPU, K+1 whole-state columns a slot."""
    plain = _plan(141, quant="int4", max_context=8192, max_batch=2)
    replay = _plan(141, quant="int4", max_context=8192, max_batch=2, spec="mtp", draft_tokens=3)
    monkeypatch.setenv("NINFER_GDN_REPLAY", "0")
    columns = _plan(141, quant="int4", max_context=8192, max_batch=2, spec="mtp", draft_tokens=3)
    per_slot = plain.state // 2
    assert columns.state == 2 * per_slot * (3 + 2)
    # 48 GDN layers x 4 tokens x ((48 + 16*128 + 48*128) fp32 + 3 x 10240 bf16 conv) a slot
    update = len(BIG.linear_layers) * ((48 + 16 * 128 + 48 * 128) * 4 + 3 * BIG.conv_dim * 2)
    assert replay.state == 2 * (per_slot + 4 * update)
    assert replay.state < 1.2 * plain.state < columns.state / 4
    # a card cuda_fast does not take (sm_75, no Triton) verifies on the reference path: columns
    monkeypatch.delenv("NINFER_GDN_REPLAY")
    old = DeviceInfo("cuda", 0, "Old GPU", (7, 5), 141 * GIB, 141 * GIB, 40, frozenset({"cuda"}))
    cfg = EngineConfig(model="qwen3.6-27b", quant="int4", max_context=8192, max_batch=2, spec="mtp", draft_tokens=3)
    assert plan_memory(BIG, cfg, old, get_plugin_manager(), None).state == columns.state
