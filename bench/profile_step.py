"""Where a decode step's GPU time goes: `ninfer bench` under torch.profiler, kernels by total time.

    python3 bench/profile_step.py [--graph] [--cold] [--model qwen3.6-27b] [--quant int4]
                                  [--prompt-len 512] [--gen-len 16] [--out DIR] [bench flags...]

Runs `ninfer bench --random-weights` inside torch.profiler (kernels only on a GPU) and prints the
CUDA kernels sorted by total time: calls, total, share of all kernel time, µs a call, and total /
gen-len (the bench also runs warm-up and capture steps, so divide by the real step count where a
kernel's calls a step are known, e.g. one per layer). Default eager (`--no-cuda-graph`): the
kernels are the ones the graph replays, only the launch gaps differ; `--graph` profiles the
CUDA-graph run itself. On a GPU one unprofiled run goes first (Triton compilation and fla's
autotuning stay out of the table; `--cold` skips it). Prefill kernels have their own names
(flash prefill, dequant, cuBLAS GEMMs); the bench's copy-bandwidth measurement shows as a copy.
Writes OUT/profile.txt and OUT/profile.json. `--device cpu --model DIR` runs it on a tiny
checkpoint to check the script (CPU ops instead of kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--cold", action="store_true", help="no warm-up run before the profiled one (compilation and "
                    "autotuning then show in the table)")
    ap.add_argument("--graph", action="store_true",
                    help="profile the CUDA-graph run (kernels as replayed, launch gaps included) instead of eager")
    args, rest = ap.parse_known_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ninfer import bench
    from ninfer.cli import bench_config, build_parser

    argv = ["bench", "--random-weights", *([] if args.graph else ["--no-cuda-graph"]), *rest]
    for flag, default in (("--model", "qwen3.6-27b"), ("--quant", "int4"), ("--prompt-len", "512"), ("--gen-len", "16")):
        if flag not in rest:
            argv += [flag, default]
    cli = build_parser().parse_args(argv)
    config, opts = bench_config(cli)
    cuda = torch.cuda.is_available() and config.device != "cpu"
    # on a GPU the kernels alone: recording every CPU op as well made reading the 35B's profile take
    # minutes (two H200 calls timed out in key_averages)
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    from ninfer.plugins import get_plugin_manager
    from ninfer.startup import plan

    pm = get_plugin_manager()
    # built outside the profile: random weights and their quantization are not a step's kernels
    import time

    t0 = time.time()
    model = bench.build(plan(config, plugins=pm), pm)
    print(f"built in {time.time() - t0:.1f} s", flush=True)
    if cuda and not args.cold:
        # once outside the profile: Triton compiles and fla autotunes its prefill kernels (Triton's
        # benchmark fills and dozens of configs a kernel), which otherwise fill the table
        bench.run(config, opts, plugins=pm, model=model)
        print(f"warm-up run done in {time.time() - t0:.1f} s", flush=True)
    with profile(activities=activities) as prof:
        result = bench.run(config, opts, plugins=pm, model=model)
    print(f"ran in {time.time() - t0:.1f} s", flush=True)
    events = prof.key_averages()
    print(f"profile read in {time.time() - t0:.1f} s", flush=True)
    attr = "device_time_total" if cuda else "cpu_time_total"
    if cuda and not hasattr(events[0], attr):
        attr = "cuda_time_total"
    rows = sorted((e for e in events if getattr(e, attr, 0) > 0), key=lambda e: -getattr(e, attr))
    if cuda:
        # kernels only: CPU-side ops also carry the device time of what they launched
        rows = [e for e in rows if getattr(e, "device_type", None) is None or "CUDA" in str(getattr(e, "device_type", ""))]
        rows = [e for e in rows if e.cpu_time_total == 0 or e.key.startswith(("void", "_", "triton", "sm90", "cutlass", "ampere"))] or rows
    total = sum(getattr(e, attr) for e in rows) or 1.0
    steps = max(1, opts.gen_len)
    lines = [f"{' '.join(argv)}", f"decode {result['decode']['tok_s']} tok/s eager, {result['decode']['ms_per_step']} ms/step; "
             f"kernel time {total / 1e3:.1f} ms over prefill + {steps} decode steps", "",
             f"{'kernel':80s} {'calls':>7s} {'total ms':>9s} {'share':>6s} {'µs/call':>8s} {'µs/step':>9s}"]
    table = []
    for e in rows[: args.rows]:
        t = getattr(e, attr)
        table.append({"kernel": e.key, "calls": e.count, "total_us": t, "share": t / total})
        lines.append(f"{e.key[:80]:80s} {e.count:7d} {t / 1e3:9.2f} {100 * t / total:5.1f}% {t / max(1, e.count):8.2f} "
                     f"{t / steps:9.1f}")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.txt").write_text(text + "\n")
    (out / "profile.json").write_text(json.dumps({"command": argv, "bench": result, "kernels": table}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
