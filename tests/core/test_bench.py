"""`ninfer bench` end to end on a tiny checkpoint (CPU in CI; the same code runs the 27B on a GPU)."""

from __future__ import annotations

import json

import pytest

from ninfer.bench import weight_bytes_read
from ninfer.cli import main
from ninfer.testing import load_model, make_tiny

VOCAB = 512


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("tiny27"), vocab=VOCAB, layers=4)


def _bench(tiny, tmp_path, capsys, *flags):
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(tiny), "--device", "cpu", "--random-weights", *flags, "--json", str(out)]
    assert main(argv) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_bench_reports_the_contract(tiny, tmp_path, capsys):
    r, table = _bench(tiny, tmp_path, capsys, "--quant", "bf16", "--prompt-len", "24", "--gen-len", "6")
    assert r["config"]["prompt_len"] == 24 and r["config"]["max_context"] == 30
    # the default chunk: on the CPU 1024, never more than --max-context
    assert r["config"]["prefill_chunk"] == 30 and r["config"]["cuda_graph"] is False
    assert r["prefill"]["tokens"] == 24 and r["prefill"]["tok_s"] > 0
    d = r["decode"]
    # the prompt's token comes from prefill; two warm-up steps; then the timed ones
    assert d["timed_steps"] == 3 and d["context_from"] == 26 and d["context_to"] == 29 and d["tok_s"] > 0
    b = r["bytes_per_step"]
    assert b["total"] == b["weights"] + b["kv"] + b["state"] and b["kv"] > 0 and b["state"] > 0
    assert r["copy_bandwidth_gbs"] > 0 and 0 < r["roofline_share"]
    assert r["roofline_ms"] == pytest.approx(1000 * b["total"] / (r["copy_bandwidth_gbs"] * 1e9), rel=0.01)
    assert r["memory"]["plan"]["weights_gib"] > 0 and r["kernels"]["attention[full]"]
    assert "roofline" in table and "decode" in table


def test_the_switches_a_run_was_under_are_recorded(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NINFER_PDL", "0")
    monkeypatch.setenv("NINFER_CACHE", str(tmp_path / "cache"))  # a place, not a switch
    r, table = _bench(tiny, tmp_path, capsys, "--quant", "bf16", "--prompt-len", "24", "--gen-len", "6")
    assert r["config"]["switches"].get("NINFER_PDL") == "0" and "NINFER_CACHE" not in r["config"]["switches"]
    assert "NINFER_PDL=0" in table.splitlines()[0]


def test_long_context_without_its_prefill(tiny, tmp_path, capsys):
    r, _ = _bench(tiny, tmp_path, capsys, "--quant", "bf16", "--kv-dtype", "int8", "--prompt-len", "8",
                  "--context-len", "100", "--gen-len", "5")  # fmt: skip
    assert r["config"]["random_kv_prefix"] == 92 and r["decode"]["context_from"] == 102
    assert r["prefill"]["tokens"] == 8


def test_compare_transformers_shares_the_weights(tiny, tmp_path, capsys):
    pytest.importorskip("transformers")
    r, table = _bench(tiny, tmp_path, capsys, "--quant", "bf16", "--prompt-len", "16", "--gen-len", "4",
                      "--compare-transformers", "--compare-gen-len", "2")  # fmt: skip
    hf = r["transformers"]
    # fp32 on the CPU: both models compute the same function of the same tensors
    assert hf["first_token_match"] is True and hf["decode_tok_s"] > 0 and hf["ratio"] > 0
    assert "transformers" in table


def test_weight_bytes_count_every_linear_once(tiny):
    model = load_model(tiny, "cpu")
    linears = sum(m.prepared.numel() * 4 for m in model.modules() if hasattr(m, "prepared") and m.prepared is not None)
    small = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n != "embed_tokens")
    # every linear, the small buffers (norms, conv taps, gates) and one embedding row (fp32 on the CPU)
    assert weight_bytes_read(model, rows=1) == linears + small + model.shape.hidden_size * 4


def test_bad_lengths_are_user_errors(tiny, capsys):
    assert main(["bench", "--model", str(tiny), "--device", "cpu", "--gen-len", "2"]) == 2
    assert "--gen-len" in capsys.readouterr().err
    assert main(["bench", "--model", str(tiny), "--device", "cpu", "--prompt-len", "9", "--context-len", "4"]) == 2
    assert "--context-len" in capsys.readouterr().err


def test_a_campaign_reuses_its_model(tiny, monkeypatch):
    """bench.run with a model built earlier (bench/dense_27b.py's campaigns) plans the run again and
    runs it on that model: no build time, the same weights. On the CPU nothing is credited to the
    plan (`held_bytes` counts a CUDA allocator's memory, test_memory covers the credit)."""
    from ninfer import bench, startup
    from ninfer.cli import bench_config, build_parser
    from ninfer.plugins import get_plugin_manager

    seen = []
    real_plan = startup.plan
    monkeypatch.setattr(startup, "plan", lambda *a, **k: seen.append(k.get("held_bytes", 0)) or real_plan(*a, **k))
    pm = get_plugin_manager()
    argv = ["bench", "--model", str(tiny), "--device", "cpu", "--random-weights", "--quant", "bf16", "--prompt-len", "16",
            "--gen-len", "4"]
    config, opts = bench_config(build_parser().parse_args(argv))
    model = bench.build(real_plan(config, plugins=pm), pm)
    first = bench.run(config, opts, plugins=pm, model=model)
    second = bench.run(config, opts, plugins=pm, model=model)
    assert first["build_s"] is None and second["build_s"] is None
    assert seen == [0, 0] and second["decode"]["tok_s"] > 0
