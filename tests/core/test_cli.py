"""The command line is a contract: exact --json output, and exit code 2 with one sentence for any
input a user can get wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from ninfer.cli import main
from ninfer.testing import make_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("tiny") / "ck", seed=3, vocab=248320)


@pytest.fixture(scope="module")
def tiny_small_vocab(tmp_path_factory):
    return make_tiny("qwen3.6-35b-a3b", tmp_path_factory.mktemp("tiny") / "moe", seed=4, vocab=512)


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_interface_matches_transformers_greedy(capsys, tiny_small_vocab):
    """The exact interface an outside check uses: --prompt-ids --raw --greedy --json --device cpu."""
    from transformers import AutoConfig, Qwen3_5MoeForCausalLM

    prompt = [5, 17, 300, 42, 7, 99, 250, 3]
    rc, out, err = run_cli(
        capsys, "--model", str(tiny_small_vocab), "--prompt-ids", ",".join(map(str, prompt)),
        "--raw", "--greedy", "--max-new", "12", "--json", "--device", "cpu", "--ignore-eos",
    )
    assert rc == 0, err
    result = json.loads(out)  # exactly one JSON object on stdout
    assert set(result) == {"text", "reasoning_content", "token_ids", "finish_reason", "usage", "stats"}
    assert result["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 12}
    assert result["finish_reason"] == "length"
    assert set(result["stats"]) >= {"prefill_tok_s", "decode_tok_s", "spec"}

    cfg = AutoConfig.from_pretrained(tiny_small_vocab).text_config
    model = Qwen3_5MoeForCausalLM.from_pretrained(tiny_small_vocab, config=cfg, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(12):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    assert result["token_ids"] == ids[0, len(prompt):].tolist()


def test_chat_prompt_streams_text(capsys, tiny):
    rc, out, err = run_cli(capsys, "--model", str(tiny), "--prompt", "Hello", "--max-new", "4", "--device", "cpu", "--seed", "1")
    assert rc == 0, err
    assert "prompt tokens" in err and "decode" in err


def test_messages_file_and_no_thinking(capsys, tiny, tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}))
    rc, out, err = run_cli(capsys, "--model", str(tiny), "--messages", str(f), "--no-thinking", "--greedy",
                           "--max-new", "3", "--json", "--device", "cpu")
    assert rc == 0, err
    result = json.loads(out)
    assert result["usage"]["completion_tokens"] <= 3
    assert result["reasoning_content"] == ""


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--prompt-ids", "1,x,3", "--raw"], "comma-separated integers"),
        (["--prompt-ids", ","], "at least one token"),
        (["--prompt-ids", "999999999"], "outside the vocabulary"),
        (["--messages", "/nonexistent/m.json"], "no such file"),
        (["--max-new", "0", "--prompt", "x"], "--max-new"),
        (["--temperature", "5", "--prompt", "x"], "temperature"),
        (["--top-p", "1.5", "--prompt", "x"], "top_p"),
        (["--presence-penalty", "9", "--prompt", "x"], "presence_penalty"),
        (["--device", "tpu", "--prompt", "x"], "--device"),
        (["--device", "cuda", "--prompt", "x"], "CUDA"),
        (["--max-context", "8", "--prompt", "x"], "--max-context"),
        ([], "Give a prompt"),
        (["--stop", "", "--prompt", "x"], "stop"),
        (["--max-context", "0", "--prompt", "x"], "--max-context"),
        (["--stop-token-id", "-1", "--prompt", "x"], "--stop-token-id"),
        (["--stop-token-id", "999999999", "--prompt", "x"], "outside this model's vocabulary"),
        (["--draft-tokens", "3", "--prompt", "x"], "--spec"),
        (["--prefill-chunk-busy", "-1", "--prompt", "x"], "--prefill-chunk-busy"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(capsys, tiny, argv, match):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rc, out, err = run_cli(capsys, "--model", str(tiny), "--device", "cpu", *argv) if "--device" not in argv else run_cli(
        capsys, "--model", str(tiny), *argv
    )
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("ninfer: error: ") and match.lower() in last.lower()
    assert "Traceback" not in err and out == ""


def test_bad_messages_content(capsys, tiny, tmp_path):
    cases = {
        "notjson.json": "{not json",
        "empty.json": "[]",
        "badrole.json": json.dumps([{"role": "wizard", "content": "x"}]),
        "badtype.json": json.dumps([{"role": "user", "content": 5}]),
    }
    for name, text in cases.items():
        f = tmp_path / name
        f.write_text(text)
        rc, out, err = run_cli(capsys, "--model", str(tiny), "--messages", str(f), "--device", "cpu")
        assert rc == 2, (name, err)
        assert err.strip().splitlines()[-1].startswith("ninfer: error: ") and "Traceback" not in err


def test_unknown_model_and_missing_weights_list_where_looked(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    rc, _, err = run_cli(capsys, "--model", "qwen9-1t", "--prompt", "x", "--device", "cpu")
    assert rc == 2 and "qwen3.6-27b" in err
    rc, _, err = run_cli(capsys, "--model", "qwen3.6-27b", "--prompt", "x", "--device", "cpu")
    assert rc == 2
    assert str(tmp_path / "models") in err and str(tmp_path / "hub") in err
    rc, _, err = run_cli(capsys, "--model", str(tmp_path / "nope"), "--prompt", "x", "--device", "cpu")
    assert rc == 2 and "nope" in err


def test_impossible_request_fails_before_weights_load(capsys, tmp_path, monkeypatch):
    """A 27B in bf16 does not fit this machine's memory: exit 2 naming the fix, nothing loaded."""
    from ninfer.device import probe

    cpu = probe("cpu")
    if cpu.total_memory > 200 * 2**30:
        pytest.skip("this machine could hold a bf16 27B")
    rc, out, err = run_cli(capsys, "plugins", "--model", "qwen3.6-27b", "--quant", "bf16", "--device", "cpu")
    assert rc == 2 and "PROBLEM" in out and "--quant" in out
    monkeypatch.setenv("NINFER_MODELS", str(tmp_path))
    ck = tmp_path / "qwen3.6-27b"
    ck.mkdir()
    import shutil
    from pathlib import Path

    import ninfer_plugins.qwen36_27b as reg

    shutil.copy(Path(reg.__file__).parent / "config.json", ck / "config.json")
    # an index whose shards do not exist: if validation ran after loading began, this would fail
    # on the missing shard instead of on memory
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00015.safetensors"}}
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    rc, out, err = run_cli(capsys, "--model", "qwen3.6-27b", "--quant", "bf16", "--prompt", "x", "--device", "cpu")
    assert rc == 2 and "GiB" in err and "--quant" in err


def test_plugins_report(capsys, tiny):
    rc, out, err = run_cli(capsys, "plugins", "--model", str(tiny), "--device", "cpu")
    assert rc == 0, err
    for word in ("device", "sampler", "attention[full]", "attention[linear]", "linear[bf16"):
        assert word in out
    # the CPU's chunk (1024), and the busy chunk's default (2048) cut to it
    assert "(prefill chunk 1024, 1024 while others decode)" in out
    rc, out, err = run_cli(capsys, "plugins", "--device", "cpu")
    assert rc == 0 and "qwen3.6-35b-a3b" in out


def test_prefill_chunk_flags_reach_the_engine_config():
    from ninfer.cli import build_parser, engine_config

    args = build_parser().parse_args(["serve", "--model", "x", "--prefill-chunk", "4096", "--prefill-chunk-busy", "512"])
    config = engine_config(args, max_batch=2)
    assert (config.prefill_chunk, config.prefill_chunk_busy) == (4096, 512)
    config = engine_config(build_parser().parse_args(["serve", "--model", "x"]))
    assert (config.prefill_chunk, config.prefill_chunk_busy) == (0, 0)  # the defaults' marker


def test_make_tiny_command(capsys, tmp_path):
    rc, out, err = run_cli(capsys, "make-tiny", "--like", "qwen3.8-27b", "--out", str(tmp_path / "t"), "--vocab", "256")
    assert rc == 0, err
    assert (tmp_path / "t" / "config.json").exists()
    rc, out, err = run_cli(capsys, "make-tiny", "--like", "qwen3.8-27b", "--out", str(tmp_path / "t2"), "--vocab", "-5")
    assert rc == 2


def test_make_tiny_never_overwrites(capsys, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    rc, out, err = run_cli(capsys, "make-tiny", "--like", "qwen3.8-27b", "--out", str(tmp_path / "full"), "--vocab", "256")
    assert rc == 2 and "never overwrites" in err and "Traceback" not in err
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_output_paths_checked_before_the_work(capsys, tiny, tmp_path):
    """A path the command writes at its end fails at the start, in one sentence."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, out, err = run_cli(capsys, "bench", "--model", str(tiny), "--device", "cpu", "--prompt-len", "8", "--gen-len", "4",
                           "--json", str(tmp_path / "missing" / "b.json"))
    assert rc == 2 and "does not exist" in err and "Traceback" not in err
    rc, out, err = run_cli(capsys, "convert", "--model", str(tiny), "--quant", "int8", "--out", str(afile / "sub"))
    assert rc == 2 and "is a file" in err and "Traceback" not in err


def test_serve_refuses_a_port_out_of_range():
    from ninfer.errors import UserError
    from ninfer.server.app import bind

    for port in (70000, -1):
        with pytest.raises(UserError, match="not a TCP port"):
            bind("127.0.0.1", port)


def test_console_script_runs_and_exits_2_on_argparse_errors():
    proc = subprocess.run([sys.executable, "-m", "ninfer.cli", "--quant", "int3"], capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
