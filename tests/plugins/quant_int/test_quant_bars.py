"""bench/quant_bars.py (issue 3's bar table on the dispatched kernels, GPU only): its shape table
agrees with `--quant int4`'s recipe, and its summary counts the rows that meet each bar."""

from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import quant_bars as QB  # noqa: E402


def _scheme_for(model: str):
    from ninfer_plugins.quant_int.recipes import recipe

    if model == "35b":
        shape, spec = types.SimpleNamespace(num_experts=256, num_hidden_layers=40), types.SimpleNamespace(id="qwen3.6-35b-a3b")
    else:
        shape, spec = types.SimpleNamespace(num_experts=0), types.SimpleNamespace(id="qwen3.6-27b")
    return recipe("int4", shape, spec).scheme_for


def test_rows_take_the_int4_recipes_schemes():
    for label, n, k, fmt, _, name in QB.ROWS:
        assert _scheme_for(label.split(".")[0])(name, n, k) == fmt, label
    assert QB.scheme("int4", "q5_g64") == "q5_g64" and QB.scheme("nvfp4", "q5_g64") == "nvfp4"
    assert QB.scheme("int8", "q4_g64") == "q8_g32"


def _row(shape, fmt, m1_share, m4_over_m1, m1024_share):
    return {"shape": shape, "fmt": fmt, "n": 1, "k": 1, "m1_us": 10.0, "m1_share": m1_share, "m1_kernel": "KW",
            "m4_over_m1": m4_over_m1, "m8_us": 12.0, "m16_us": 14.0, "m1024_tflops": 500.0,
            "m1024_share_cublas": m1024_share}


def test_verdicts_count_the_rows_that_meet_each_bar():
    rows = [_row("27b.down_proj", "q5_g64", 0.90, 1.10, 0.70), _row("27b.lm_head", "q6_g64", 0.80, 1.20, 0.50),
            _row("35b.expert.down", "q5_g64", 0.30, 1.40, 0.20),
            {"shape": "27b.k_proj", "fmt": "q4_g64", "error": "RuntimeError: x"}]
    lines = QB.verdicts(rows, {"27b.down_proj": {"us": 25.0, "share": 0.4}})
    q5 = [line for line in lines if line.startswith("q5_g64")]
    assert "the 27B's big matrices: 1 of 1 (27b.down_proj 90%)" in q5[0]  # 35b rows are not the big ones
    assert "27b.down_proj 2.50x" in q5[1]
    assert "1 of 2; over: 35b.expert.down 1.40x" in q5[2]
    assert "1 of 2; under: 35b.expert.down 20%" in q5[3]
    q6 = [line for line in lines if line.startswith("q6_g64")]
    assert "0 of 1" in q6[0] and "over: 27b.lm_head 1.20x" in q6[1]
    t = QB.table(rows, {"27b.down_proj": {"us": 25.0, "share": 0.4}})
    assert "| q5_g64 | 27b.down_proj | 1x1 | 10.0 | 90% | KW | 1.10 |" in t and "25.0 (40%)" in t
    assert "error: RuntimeError: x" in t
