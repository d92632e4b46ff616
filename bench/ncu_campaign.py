"""Where the M = 1..4 quantized kernels lose their bandwidth: Nsight Compute over a few cases, one
table (the next session's first device call; nothing here has run yet).

    python3 bench/ncu_campaign.py [--out DIR] [--full]

For each case of CASES, runs `ncu --clock-control none --csv --metrics ... -k regex:<kernel> -s 3
-c 1 python3 bench/ncu_linear.py ...` (the fourth launch of a plain, checked run of one linear)
and prints: duration, DRAM throughput (% of peak), SM and L1 throughput, issue-slot use, achieved
occupancy, registers, the top stall reasons (cycles per issued instruction). `--full` also writes
the complete SpeedOfLight / WarpStateStats / MemoryWorkloadAnalysis / Occupancy / SchedulerStats
text of each case to OUT/ncu_<case>.txt. Reading: DRAM near 90% = bandwidth-bound (done); issue
slots near 100% = instruction-bound (fewer instructions a weight); neither, with long-scoreboard
or barrier stalls dominant = latency-bound (more bytes in flight per SM: stages, occupancy).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (name, ncu_linear.py arguments, kernel-name regex)
CASES = [
    ("q4_gateup_m1_h2", "--scheme q4_g64 --n 34816 --k 5120 --m 1 --path h2 --h2 32,8,4,4", "_gemv_h2_kernel"),
    ("q5_down_m1_h2", "--scheme q5_g64 --n 5120 --k 17408 --m 1 --path h2 --h2 32,8,4,4", "_gemv_h2_kernel"),
    ("q5_oproj_m1_h2", "--scheme q5_g64 --n 5120 --k 6144 --m 1 --path h2 --h2 32,4,4,4", "_gemv_h2_kernel"),
    ("q4_gateup_m1_gemv", "--scheme q4_g64 --n 34816 --k 5120 --m 1 --path gemv", "_gemv_kernel"),
    ("q5_qkvz_m1_gemv", "--scheme q5_g64 --n 16384 --k 5120 --m 1 --path gemv", "_gemv_kernel"),
    ("q5_down_m1_gemv", "--scheme q5_g64 --n 5120 --k 17408 --m 1 --path gemv", "_gemv_kernel"),
    ("q5_down_m4_mma", "--scheme q5_g64 --n 5120 --k 17408 --m 4 --path mma", "_qmm_kernel"),
    ("q4_gateup_m4_mma", "--scheme q4_g64 --n 34816 --k 5120 --m 4 --path mma", "_qmm_kernel"),
    ("q4_up_m4_skinny", "--scheme q4_g64 --n 17408 --k 5120 --m 4 --path skinny", "_skinny"),
    ("q6_head_m1_gemv", "--scheme q6_g64 --n 248320 --k 5120 --m 1 --path gemv", "_gemv_kernel"),
]

METRICS = {
    "gpu__time_duration.sum": "µs",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
    "l1tex__throughput.avg.pct_of_peak_sustained_active": "L1 %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occup %",
    "launch__registers_per_thread": "regs",
    "launch__grid_size": "grid",
    "smsp__inst_executed.sum": "instr",
    "smsp__warp_issue_stalled_no_instruction_per_warp_active.pct": "st.noin",
    "smsp__warp_issue_stalled_membar_per_warp_active.pct": "st.mbar",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": "st.lsb",
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct": "st.bar",
    "smsp__warp_issue_stalled_wait_per_warp_active.pct": "st.wait",
    "smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct": "st.ssb",
    "smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct": "st.math",
    "smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct": "st.mio",
    "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct": "st.lg",
}
SECTIONS = ["SpeedOfLight", "WarpStateStats", "MemoryWorkloadAnalysis", "Occupancy", "SchedulerStats", "LaunchStats"]


def parse_metrics(text: str) -> dict[str, float]:
    """ncu --csv --page details output -> {metric name: value} of the one profiled kernel (values
    with thousands separators or units in the name column are taken as printed)."""
    start = text.find('"ID"')
    if start < 0:
        return {}
    out: dict[str, float] = {}
    scale = {"ns": 1e-3, "us": 1.0, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}  # durations -> µs
    for row in csv.DictReader(io.StringIO(text[start:])):
        name, value = row.get("Metric Name"), row.get("Metric Value")
        if not name or value is None:
            continue
        try:
            v = float(value.replace(",", ""))
        except ValueError:
            continue
        out[name] = v * scale.get(row.get("Metric Unit", ""), 1.0)
    return out


def ncu_cmd(args: str, kernel: str, extra: list[str]) -> list[str]:
    return ["ncu", "--clock-control", "none", "-k", f"regex:{kernel}", "-s", "3", "-c", "1", *extra,
            sys.executable, str(ROOT / "bench" / "ncu_linear.py"), *args.split()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench_out")))
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, case_args, kernel in CASES:
        if args.only and name not in args.only.split(","):
            continue
        cmd = ncu_cmd(case_args, kernel, ["--csv", "--page", "details", "--metrics", ",".join(METRICS)])
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        got = parse_metrics(proc.stdout)
        if not got:
            print(f"{name}: no metrics (rc {proc.returncode}): {(proc.stderr or proc.stdout)[-600:]}", flush=True)
        rows.append((name, got))
        if args.full:
            full = subprocess.run(ncu_cmd(case_args, kernel, [f"--section={s}" for s in SECTIONS]),
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            (out / f"ncu_{name}.txt").write_text(full.stdout + full.stderr)
        print(f"{name}: " + ", ".join(f"{METRICS[m]} {v:g}" for m, v in got.items() if m in METRICS), flush=True)
    heads = list(METRICS.values())
    lines = [f"{'case':20s} " + " ".join(f"{h:>8s}" for h in heads)]
    for name, got in rows:
        cells = []
        for m in METRICS:
            v = got.get(m)
            cells.append(f"{v:8.1f}" if v is not None else f"{'-':>8s}")
        lines.append(f"{name:20s} " + " ".join(cells))
    table = "\n".join(lines)
    print("\n" + table)
    (out / "ncu_table.txt").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
