"""`ninfer bench --spec mtp`: the speculative run after the plain one, its statistics, round cost
and projection (CPU here; tests/plugins/spec_mtp/test_spec_gpu.py runs it captured on a GPU)."""

from __future__ import annotations

import json

import pytest
from spec_helpers import VOCAB

from ninfer.bench import tokens_per_round
from ninfer.cli import main
from ninfer.testing import make_tiny


def test_tokens_per_round_is_the_geometric_sum():
    assert tokens_per_round(0.0, 3) == 1.0
    assert tokens_per_round(1.0, 3) == 4.0
    assert tokens_per_round(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize("family,extra", [("qwen3.6-27b", []), ("qwen3.6-35b-a3b", ["--lm-head-draft"])])
def test_bench_reports_spec_stats_and_round_cost(tmp_path, capsys, family, extra):
    # the MoE family drafting from the shortlist head: what `next_session.sh bars` runs on the 35B
    ckpt = make_tiny(family, tmp_path / "ck", vocab=VOCAB, layers=4)
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(ckpt), "--device", "cpu", "--random-weights", "--quant", "bf16", "--prompt-len", "20",
            "--gen-len", "10", "--spec", "mtp", "--draft-tokens", "2", "--json", str(out), *extra]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    r = json.loads(out.read_text())
    s = r["spec"]
    assert s["method"] == "mtp" and s["draft_tokens"] == 2 and s["cuda_graph"] is False and s["eager_reason"]
    st = s["stats"]
    assert st["rounds"] == s["timed_rounds"] > 0 and st["drafted"] == 2 * st["rounds"]
    assert len(st["accepted_per_position"]) == 2 and sum(st["accepted_per_position"]) == st["accepted"]
    assert st["tokens_per_round"] == pytest.approx(1 + st["accepted"] / st["rounds"], abs=1e-3)
    assert s["plain_ms_per_step"] == r["decode"]["ms_per_step"]
    assert s["round_vs_plain_step"] == pytest.approx(s["ms_per_round"] / s["plain_ms_per_step"], rel=1e-2)
    assert s["rounds_per_s"] == pytest.approx(1000 / s["ms_per_round"], rel=1e-2)
    for a in (0.73, 0.88):
        p = s["projection"][f"a={a}"]
        assert p["tokens_per_round"] == pytest.approx(1 + a + a * a, abs=1e-3)
        assert p["tok_s"] == pytest.approx(s["rounds_per_s"] * p["tokens_per_round"], rel=1e-2)
    assert "sum_{i=0..K} a^i" in s["projection"]["formula"]
    assert "projection a=0.73" in table and "ms/round" in table
