"""`ninfer run --spec mtp --draft-tokens K [--lm-head-draft] --json`, and what it refuses."""

from __future__ import annotations

import json

import pytest
from spec_helpers import VOCAB

from ninfer.cli import main
from ninfer.testing import make_tiny

BASE = ["run", "--prompt-ids", "5,9,2,77,31,8", "--max-new", "24", "--greedy", "--ignore-eos", "--json", "--device", "cpu"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny("qwen3.6-35b-a3b", tmp_path_factory.mktemp("cli"), vocab=VOCAB, seed=3)


def _run(capsys, *args) -> dict:
    assert main([*BASE, *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_reports_spec_stats_and_the_same_tokens(ckpt, capsys):
    plain = _run(capsys, "--model", str(ckpt))
    spec = _run(capsys, "--model", str(ckpt), "--spec", "mtp", "--draft-tokens", "2")
    assert spec["token_ids"] == plain["token_ids"]
    s = spec["stats"]["spec"]
    assert s["rounds"] > 0 and s["drafted"] == 2 * s["rounds"]
    assert {"accepted", "accepted_per_position", "fallback_steps", "acceptance", "tokens_per_round"} <= set(s)
    short = _run(capsys, "--model", str(ckpt), "--spec", "mtp", "--draft-tokens", "3", "--lm-head-draft")
    assert short["token_ids"] == plain["token_ids"]


def test_a_checkpoint_without_mtp_is_refused_before_loading(tmp_path, capsys):
    ckpt = make_tiny("qwen3.6-27b", tmp_path / "nomtp", vocab=VOCAB, layers=4)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["text_config"]["mtp_num_hidden_layers"] = 0
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert main([*BASE, "--model", str(ckpt), "--spec", "mtp"]) == 2
    assert "--spec none" in capsys.readouterr().err


def test_draft_tokens_outside_1_to_5_is_a_user_error(ckpt, capsys):
    assert main([*BASE, "--model", str(ckpt), "--spec", "mtp", "--draft-tokens", "6"]) == 2
    assert "--draft-tokens" in capsys.readouterr().err


def test_lm_head_draft_without_a_speculator_is_refused(ckpt, capsys):
    assert main([*BASE, "--model", str(ckpt), "--lm-head-draft"]) == 2
    assert "--spec mtp" in capsys.readouterr().err


def test_convert_shortlist_through_the_cli(tmp_path, capsys):
    from ninfer.cli import main
    from ninfer.testing import make_tiny

    ckpt = make_tiny("qwen3.6-27b", tmp_path / "ck", seed=2, vocab=512)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 20)
    rc = main(["convert", "--model", str(ckpt), "--shortlist", "40", "--corpus", str(corpus)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert (ckpt / "shortlist.safetensors").is_file()
    rc = main(["convert", "--model", str(ckpt)])
    assert rc == 2 and "--quant and --out" in capsys.readouterr().err
