"""Each captured graph of a `ninfer bench` run, kernel by kernel, in launch order: where a plain
step's time goes and what the MTP verify (the same layers at M = K + 1) adds to it.

    NINFER_PDL=0 python3 bench/graph_kernels.py [--replays 5] [--out DIR] [bench flags...]

Runs `ninfer bench --random-weights` (default: the 27B int4, 8,192-token prompt, MTP K = 3 with the
shortlist head) and, each time the bench times a graph (the plain step, the spec round, the verify
pass alone), profiles `--replays` more replays of it under torch.profiler and reads the kernels
from its trace in launch order. Prints, per graph, the replay's device time, the kernels' summed
time and the gaps, and per kernel name the calls and µs a replay; then the verify against the
plain step, name by name. Run it with NINFER_PDL=0: with programmatic dependent launch a kernel
starts while the one before it drains and its recorded time includes that wait, so the sum of
kernel times overstates the replay. Writes OUT/graph_kernels.json: every graph's kernels of one
replay in order (name, start µs from the replay's first kernel, µs), for reading per layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path


def _kernels(trace_path: str) -> list[dict]:
    """The trace's GPU kernels and copies, sorted by start."""
    events = json.loads(Path(trace_path).read_text())
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    out = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(out, key=lambda e: e["ts"])


def _split_replays(kernels: list[dict], replays: int) -> list[list[dict]]:
    """The kernels cut into replays: every replay launches the same number of kernels."""
    if not kernels or len(kernels) % replays:
        return [kernels]
    n = len(kernels) // replays
    return [kernels[i * n:(i + 1) * n] for i in range(replays)]


def profile_graph(graph, replays: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        runs = _split_replays(_kernels(path), replays)
    spans, sums = [], []
    by_name: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        spans.append(run[-1]["ts"] + run[-1]["dur"] - run[0]["ts"])
        sums.append(sum(e["dur"] for e in run))
        per: dict[str, float] = defaultdict(float)
        for e in run:
            per[e["name"]] += e["dur"]
        for name, us in per.items():
            by_name[name].append(us)
    first = runs[0]
    calls: dict[str, int] = defaultdict(int)
    for e in first:
        calls[e["name"]] += 1
    return {
        "replays": len(runs),
        "kernels_a_replay": len(first),
        "span_us": statistics.median(spans),
        "kernel_sum_us": statistics.median(sums),
        "by_name": {n: {"calls": calls[n], "us": round(statistics.median(v), 2)} for n, v in by_name.items()},
        "order": [(e["name"][:90], round(e["ts"] - first[0]["ts"], 2), e["dur"]) for e in first],
    }


def _short(name: str) -> str:
    return name[:72]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--rows", type=int, default=30)
    args, rest = ap.parse_known_args()
    import torch

    from ninfer import bench
    from ninfer.cli import bench_config, build_parser

    if not torch.cuda.is_available():
        print("graph_kernels: needs a CUDA GPU")
        return 0
    argv = ["bench", "--random-weights", *rest]
    for flag, default in (("--model", "qwen3.6-27b"), ("--quant", "int4"), ("--prompt-len", "8192"), ("--gen-len", "32")):
        if flag not in rest:
            argv += [flag, default]
    if "--spec" not in rest:
        argv += ["--spec", "mtp", "--draft-tokens", "3", "--lm-head-draft"]
    cli = build_parser().parse_args(argv)
    config, opts = bench_config(cli)
    names = ["plain step", "spec round", "verify pass"]
    graphs: list[tuple[str, dict]] = []
    timed = bench._graph_ms

    def graph_ms(graph):
        ms = timed(graph)
        if graph is not None:
            label = names[len(graphs)] if len(graphs) < len(names) else f"graph {len(graphs)}"
            graphs.append((label, {"replay_ms": ms, **profile_graph(graph, args.replays)}))
        return ms

    bench._graph_ms = graph_ms
    print(f"ninfer {' '.join(argv)} (NINFER_PDL={os.environ.get('NINFER_PDL', '1')})", flush=True)
    result = bench.run(config, opts)
    lines = []
    for label, g in graphs:
        lines.append(f"== {label}: replay {g['replay_ms']} ms (events), kernels span {g['span_us'] / 1e3:.3f} ms, "
                     f"kernel sum {g['kernel_sum_us'] / 1e3:.3f} ms, {g['kernels_a_replay']} kernels a replay")
        top = sorted(g["by_name"].items(), key=lambda kv: -kv[1]["us"])[: args.rows]
        for name, v in top:
            lines.append(f"   {_short(name):72s} {v['calls']:5d} {v['us']:10.1f} us {v['us'] / max(1, v['calls']):8.2f} us/call")
    found = dict(graphs)
    if "plain step" in found and "verify pass" in found:
        a, b = found["plain step"]["by_name"], found["verify pass"]["by_name"]
        lines.append("== verify pass minus plain step, by kernel name (us a replay)")
        rows = []
        for name in set(a) | set(b):
            ua, ub = a.get(name, {}).get("us", 0.0), b.get(name, {}).get("us", 0.0)
            rows.append((ub - ua, name, a.get(name, {}).get("calls", 0), ua, b.get(name, {}).get("calls", 0), ub))
        for d, name, ca, ua, cb, ub in sorted(rows, reverse=True)[: args.rows]:
            lines.append(f"   {_short(name):72s} plain {ca:4d} x {ua:9.1f}   verify {cb:4d} x {ub:9.1f}   {d:+9.1f}")
    text = "\n".join(lines)
    print(text, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(out, "graph_kernels.json").write_text(json.dumps({"command": argv, "pdl": os.environ.get("NINFER_PDL", "1"),
                                                           "graphs": dict(graphs), "spec": result.get("spec")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
