"""Dense 27B end-to-end campaign for the lent GPU, in one call (issue 4).

    python3 bench/dense_27b.py [--budget-s 260] [--skip-tests] [--only NAME,...]

1. the `-m gpu` tests of plugins/qwen_hybrid, plugins/cuda_fast and core/graphs (log: $OUT/pytest.log;
   `-v -x --tb=short`, so a run cut short still names the first failure);
2. `ninfer bench --model qwen3.6-27b --random-weights ...` for each entry of RUNS, in this process
   (the exact command line of each is in its JSON; runs of one --quant share the weights built
   for the first of them), JSON to $OUT/<name>.json;
3. a table last. Runs that would start past the budget are skipped and listed.

`--variants "X=1|NINFER_GDN_COMMIT=0|X=1|NINFER_GDN_COMMIT=0"` runs each selected entry once per
variant, in this order, with those environment variables set for that run only (`X=1`: the tree as
committed; a variant may set several, space-separated). The weights are built once, so an A/B of N
variants costs one build instead of N processes' worth. Only switches that are read when a run
builds its engine, graphs or launches may vary this way (`PER_RUN_SWITCHES`, each checked to be
read at run time, not at import or model build); others are refused.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
import traceback
from unittest import mock
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT", ROOT / "bench_out"))
MODEL = "qwen3.6-27b"

# name -> flags after `ninfer bench --model qwen3.6-27b --random-weights`
RUNS = {
    # the bf16 step without the transformers comparison (its 27B copy costs a minute)
    "bf16_8k_alone": "--quant bf16 --prompt-len 8192 --gen-len 48",
    "int4_8k": "--quant int4 --prompt-len 8192 --gen-len 64",
    "int4_131k_int8kv": "--quant int4 --kv-dtype int8 --prompt-len 512 --context-len 131072 --gen-len 64",
    # issue 6's bar: one round (3 drafts + verify of 4) against a plain step, measured in one process
    "int4_8k_mtp3": "--quant int4 --prompt-len 8192 --gen-len 64 --spec mtp --draft-tokens 3",
    # the same drafting with the shortlist head (the corpus-frequency stand-in without a convert)
    "int4_8k_mtp3_short": "--quant int4 --prompt-len 8192 --gen-len 64 --spec mtp --draft-tokens 3 --lm-head-draft",
    "nvfp4_8k": "--quant nvfp4 --prompt-len 8192 --gen-len 64",
    "int8_8k": "--quant int8 --prompt-len 8192 --gen-len 64",
    "bf16_8k": "--quant bf16 --prompt-len 8192 --gen-len 48 --compare-transformers --compare-gen-len 6",
}
TESTS = ["tests/plugins/qwen_hybrid/test_gpu.py", "tests/plugins/cuda_fast", "tests/core/test_graphs.py", "tests/plugins/spec_mtp/test_spec_gpu.py"]
T0 = time.time()
# switches read per run (engine, graph decoder, speculative round, or at each launch/capture), so
# they may differ between runs that share one model; see --variants
PER_RUN_SWITCHES = {
    "X",  # a no-op name: the tree as committed
    "NINFER_NV_SG", "NINFER_NV_MERGE", "NINFER_DENSE_GEMV", "NINFER_DENSE_GEMV_CFG", "NINFER_MTP_FUSE",
    "NINFER_GDN_COMMIT", "NINFER_ROUND_IO", "NINFER_GDN_VERIFY_BV", "NINFER_GDN_GATES_EARLY",
    "NINFER_MOE_COMBINE_LOOP", "NINFER_PAIR_GATE_UP", "NINFER_PAIR_DOWN", "NINFER_PAIR_GATE_UP1", "NINFER_PAIR_DOWN1",
    "NINFER_ROUTE_GEMV_T", "NINFER_ROUTE_GEMV_WARPS",
    "NINFER_GDN_AHEAD", "NINFER_STEP_TAIL",
    "NINFER_GDN_PAIRED", "NINFER_GDN_SPLIT_NORM", "NINFER_GDN_AB_EARLY", "NINFER_SPEC_AHEAD", "NINFER_TC_LATE",
    "NINFER_MTP_SEED_ROWS", "NINFER_KW", "NINFER_MOE_BLOCK", "NINFER_MOE_BLOCK_NORM",
    "NINFER_MOE_BLOCK_TOPK", "NINFER_MOE_BLOCK_MAX_T", "NINFER_MOE_PREFILL", "NINFER_L2PF", "NINFER_TKW", "NINFER_PIN", "NINFER_TKW_RING", "NINFER_TKW_XS",
    "NINFER_ATTN_OCCUPANCY", "NINFER_ATTN_WAVES", "NINFER_KW_TAIL", "NINFER_ATTN_GROUPED", "NINFER_GDN_REPLAY", "NINFER_TKW_TRY", "NINFER_GDN_CHUNK",
    "NINFER_GDN_EARLY", "NINFER_MOE_EARLY", "NINFER_KW_XREUSE", "NINFER_CU_GEMV", "NINFER_CU_TUNED", "NINFER_MOE_NORM", "NINFER_KW_TRY", "NINFER_ROUTE_TOPK",
    "NINFER_NORM_PAIRS",
    # =0 keeps launches off q5 words made at load: build with NINFER_Q5_WORDS=1 in the process's
    # environment, then vary "NINFER_Q5_WORDS=0|X=1"
    "NINFER_Q5_WORDS",
    # =0 keeps launches off tuned.TUNED_CU_CARD (build with NINFER_CU_CARD=H100 so the words its
    # entries name are made at load, then vary "NINFER_Q5_WORDS=0 NINFER_CU_CARD=0|X=1")
    "NINFER_CU_CARD",
}  # not NINFER_TCD (the GEMV workspace is reserved at model load) nor anything merged or packed then


BASE_ENV = dict(os.environ)  # the process's switches, for the model build


def parse_variants(text: str) -> list[tuple[str, dict[str, str]]]:
    """"A=1 B=2|C=0" -> [("A=1 B=2", {"A": "1", "B": "2"}), ("C=0", {"C": "0"})]; unknown switches
    raise (they may be read once per process, and a variant would then silently not apply)."""
    out = []
    for part in (p.strip() for p in text.split("|")):
        if not part:
            continue
        env = {}
        for item in part.split():
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"--variants: {item!r} is not NAME=VALUE")
            if key not in PER_RUN_SWITCHES:
                raise SystemExit(f"--variants: {key} is not known to be read per run ({', '.join(sorted(PER_RUN_SWITCHES))}); "
                                 "run it as its own process instead")
            env[key] = value
        out.append((part, env))
    return out


def elapsed() -> float:
    return time.time() - T0


def run_tests(timeout: float) -> str:
    # -v -x --tb=short: a run the time limit cuts still names each finished test and the first
    # failure with its traceback (a -q run cut short printed only "...F")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-x", "--tb=short", "-p", "no:cacheprovider", "--timeout", "150", *TESTS]
    try:
        import xdist  # noqa: F401

        cmd[3:3] = ["-n", "4"]  # compiles in parallel: most of the tests' time is Triton compiling
    except ImportError:
        pass
    print("$", " ".join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
        status = f"rc={proc.returncode}"
    except subprocess.TimeoutExpired as exc:
        log = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        status = f"timeout after {timeout:.0f} s"
    (OUT / "pytest.log").write_text(log)
    tail = [line for line in log.splitlines() if line.strip()][-12:]
    print("\n".join(tail), flush=True)
    return f"{status}: {tail[-1] if tail else ''}"


def card_busy(exc: Exception, wait_s: float = 20.0) -> bool:
    """Whether a run refused for want of free GPU memory should be tried once more: twice in the
    twenty-third session a call's first run found most of the card taken (15 and 25 GiB of 79
    free) by something outside this process, and the later runs fitted. Prints who holds the
    card (nvidia-smi) and waits `wait_s` first."""
    from ninfer.errors import DeviceError

    if not isinstance(exc, DeviceError) or " free" not in str(exc):
        return False
    query = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
    try:
        users = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip() or "none listed"
    except (OSError, subprocess.SubprocessError) as err:
        users = f"nvidia-smi failed: {err}"
    print(f"card busy ({str(exc)[:160]}...); its compute processes: {users}; trying again in {wait_s:.0f} s", flush=True)
    time.sleep(wait_s)
    return True


def floor() -> None:
    """The arithmetic decode floor of each configuration (no GPU): bytes / 4.28 TB/s, the copy
    bandwidth the device README measured on the H200."""
    from ninfer.memory import weight_bytes
    from ninfer.plugins import get_plugin_manager
    from ninfer.checkpoint import find_spec

    pm = get_plugin_manager()
    spec = find_spec(MODEL, pm.collect("ninfer_checkpoints"))
    shape = pm.hook.ninfer_parse_config(hf_config={"family": spec.family, **spec.shape})
    schemes = {x.name: x for x in pm.collect("ninfer_quant_schemes")}
    bw = 4.28e12
    print(f"{'recipe':6s} {'kv':5s} {'context':>8s} {'weights GB':>10s} {'KV GB':>6s} {'state GB':>8s} {'total GB':>8s} {'floor ms':>8s} {'tok/s':>6s}")
    for quant, kv, ctx in (("bf16", "bf16", 8192), ("int4", "bf16", 8192), ("nvfp4", "bf16", 8192), ("int4", "int8", 131072)):
        recipe = None if quant == "bf16" else pm.hook.ninfer_quant_recipe(quant=quant, shape=shape, spec=spec)
        # a step reads one embedding row, not the table
        w = weight_bytes(shape, recipe, schemes, 2) - shape.vocab_size * shape.hidden_size * 2 + shape.hidden_size * 2
        kv_bytes = shape.kv_bytes_per_token(kv) * ctx
        state = 2 * shape.state_bytes_per_sequence()
        total = w + kv_bytes + state
        print(f"{quant:6s} {kv:5s} {ctx:8d} {w / 1e9:10.2f} {kv_bytes / 1e9:6.2f} {state / 1e9:8.2f} {total / 1e9:8.2f} "
              f"{1e3 * total / bw:8.2f} {bw / total:6.1f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=260)
    ap.add_argument("--test-timeout", type=float, default=80)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--variants", default="", help="'ENV...|ENV...': each selected run once per variant (see the module doc)")
    ap.add_argument("--smoke", action="store_true", help="tiny lengths on the CPU (the tiny checkpoint's shape unless "
                    "--model is given): checks this script, measures nothing")
    ap.add_argument("--floor", action="store_true", help="print the arithmetic decode floors and stop (no GPU)")
    args = ap.parse_args()
    if args.floor:
        floor()
        return 0
    OUT.mkdir(parents=True, exist_ok=True)

    tests = "skipped" if args.skip_tests or args.smoke else run_tests(args.test_timeout)

    import torch

    from ninfer import bench
    from ninfer.cli import bench_config, build_parser
    from ninfer.plugins import get_plugin_manager
    from ninfer.startup import plan

    if args.smoke and args.model == MODEL:
        # the full-size random 27B does not fit a CPU machine's memory: the tiny checkpoint's shape
        from ninfer.testing import default_tiny_path

        args.model = str(default_tiny_path())
    pm = get_plugin_manager()
    variants = parse_variants(args.variants) or [("", {})]
    names = [n for n in RUNS if not args.only or n in args.only.split(",")]
    jobs = [(n, label, env) for n in names for label, env in variants]
    results, skipped = {}, []
    model, model_key = None, None
    seen: dict[str, int] = {}
    for base, label, env in jobs:
        name = f"{base}[{label}]" if label else base
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name += f" #{seen[name]}"  # an A/B alternates a variant: each run keeps its own row
        if elapsed() > args.budget_s:
            skipped.append(name)
            continue
        flags = RUNS[base]
        if args.smoke:
            gen = 16 if "--spec" in flags else 5  # a speculative run needs room for a few rounds
            for flag, value in (("--prompt-len", 16), ("--context-len", 64), ("--gen-len", gen), ("--compare-gen-len", 2)):
                flags = re.sub(rf"{flag} \d+", f"{flag} {value}", flags)
            flags += " --device cpu"
        json_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        argv = ["bench", "--model", args.model, "--random-weights", *flags.split(), "--json", str(OUT / f"{json_name}.json")]
        print(f"\n$ {label + ' ' if label else ''}ninfer {' '.join(argv)}   [t={elapsed():.0f}s]", flush=True)
        # this run's switches; the process's environment comes back afterwards
        with mock.patch.dict(os.environ, env):
            for attempt in (0, 1):
                try:
                    cli_args = build_parser().parse_args(argv)
                    config, opts = bench_config(cli_args)
                    key = (config.quant, config.dtype, config.spec)
                    if key != model_key:
                        model = None
                        gc.collect()
                        if torch.cuda.is_available():
                            torch.cuda.empty_cache()
                        # built under the process's own switches, not this run's: a per-run switch
                        # must not decide what the build makes (NINFER_Q5_WORDS=0 first in an A/B
                        # once left the q5 words unmade for every variant, fortieth run)
                        with mock.patch.dict(os.environ, BASE_ENV, clear=True):
                            model = bench.build(plan(config, plugins=pm), pm)
                        model_key = key
                    result = bench.run(config, opts, plugins=pm, model=model)
                    result["command"] = (label + " " if label else "") + "ninfer " + " ".join(argv)
                    bench.write_json(result, str(OUT / f"{json_name}.json"))
                    results[name] = result
                    print(bench.table(result), flush=True)
                    break
                except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others
                    if attempt == 0 and card_busy(exc):
                        continue
                    traceback.print_exc()
                    results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                    break
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    (OUT / "dense_27b.json").write_text(json.dumps({"tests": tests, "skipped": skipped, "runs": results}, indent=2))
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"\n=== dense 27B campaign ({elapsed():.0f} s) on {gpu} ===")
    print(f"tests: {tests}")
    width = max([18, *(len(n) for n in results)])
    print(f"{'run':{width}s} {'prefill':>9s} {'decode':>8s} {'ms/step':>8s} {'replay':>7s} {'GB/step':>8s} {'roof ms':>8s} {'share':>6s} {'peak GiB':>8s} {'vs HF':>6s}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:{width}s} ERROR {r['error'][:110]}")
            continue
        hf = r.get("transformers") or {}
        print(
            f"{name:{width}s} {r['prefill']['tok_s']:9.0f} {r['decode']['tok_s']:8.1f} {r['decode']['ms_per_step']:8.3f} "
            f"{r['decode']['graph_replay_ms'] or 0:7.3f} "
            f"{r['bytes_per_step']['total'] / 1e9:8.2f} {r['roofline_ms']:8.3f} {100 * r['roofline_share']:5.1f}% "
            f"{r['memory']['peak_serving_gib']:8.2f} {hf.get('ratio', '-')!s:>6s}"
        )
    for name, r in results.items():
        sp = r.get("spec") if "error" not in r else None
        if sp:
            proj = sp.get("projection") or {}
            projected = ", ".join(f"{k}: {v['tok_s']} tok/s" for k, v in proj.items() if k.startswith("a="))
            print(f"{name}: spec round {sp['ms_per_round']:.3f} ms = {sp['round_vs_plain_step']}x the plain step "
                  f"(graph replay {sp.get('graph_replay_ms')} ms vs plain {r['decode']['graph_replay_ms']} ms; bar <= 1.35x), "
                  f"{sp['rounds_per_s']} rounds/s; projection {projected}")
    if skipped:
        print(f"skipped (budget): {', '.join(skipped)}")
    print(f"copy bandwidth: {', '.join(str(r.get('copy_bandwidth_gbs')) for r in results.values() if 'error' not in r)} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
