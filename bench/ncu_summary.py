"""What one kernel launch in an Nsight Compute report waits on, in a page of text:

    python3 bench/ncu_summary.py REPORT.ncu-rep [--regions 12]

Needs `ncu` on PATH (the lent GPU machine has it). Prints the launch's duration, throughput,
occupancy and issue figures (the details page), its top stall reasons in cycles per issued
instruction (the raw page), and, when the report was taken with `--import-source yes` and the
source counters (`--set full`), the SASS split into `--regions` equal runs of instructions with
the share of the warp-stall samples and the instructions a warp executed in each, the hottest
lines beside it. Written after the GDN verify's profile (BENCHMARKS.md, twenty-fifth run), where
the samples by region showed which phase of a fully unrolled kernel held its time.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys

KEYS = ("Duration", "DRAM Throughput", "L2 Cache Throughput", "Executed Ipc Active", "Issue Slots Busy",
        "No Eligible", "Warp Cycles Per Issued Instruction", "Registers Per Thread", "Block Limit Registers",
        "Block Limit Shared Mem", "Theoretical Occupancy", "Achieved Occupancy", "Grid Size", "Block Size")


def _ncu(report: str, *args: str) -> str:
    return subprocess.run(["ncu", "--import", report, *args], capture_output=True, text=True, check=False).stdout


def _num(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def details(report: str) -> None:
    seen = set()
    for line in _ncu(report, "--page", "details").splitlines():
        name = line.strip().split("  ")[0]
        if name in KEYS and name not in seen:
            seen.add(name)
            print("  " + " ".join(line.split()))


def stalls(report: str, top: int = 9) -> None:
    rows = list(csv.reader(io.StringIO(_ncu(report, "--page", "raw", "--csv"))))
    if len(rows) < 3:
        print("  (no raw metrics)")
        return
    head, vals = rows[0], rows[2]
    found = []
    for name, v in zip(head, vals):
        x = _num(v)
        if "issue_stalled" in name and name.endswith("per_issue_active.ratio") and x is not None:
            found.append((x, name.split("stalled_")[-1].removesuffix("_per_issue_active.ratio")))
    for x, name in sorted(found, reverse=True)[:top]:
        print(f"  stall {name:32s} {x:6.2f} cycles an issued instruction")


def sass(report: str, regions: int, hottest: int = 12) -> None:
    rows = list(csv.reader(io.StringIO(_ncu(report, "--page", "source", "--csv", "--print-source", "sass"))))
    # first row: the kernel's name; second: the header
    if len(rows) < 3 or "Source" not in rows[1]:
        print("  (no source counters: take the report with --set full --import-source yes)")
        return
    head, data = rows[1], rows[2:]
    i_src, i_smp = head.index("Source"), head.index("Warp Stall Sampling (All Samples)")
    i_ex = head.index("Instructions Executed")
    smp = [int(_num(r[i_smp]) or 0) for r in data]
    ex = [int(_num(r[i_ex]) or 0) for r in data]
    total = sum(smp) or 1
    warps = ex[0] or max(ex) or 1  # the first instruction runs once a warp: its count is the warps launched
    print(f"  {len(data)} SASS instructions, {sum(ex) / warps:.0f} executed a warp, {total} stall samples")
    step = max(1, -(-len(data) // regions))
    for a in range(0, len(data), step):
        s = sum(smp[a : a + step])
        print(f"  instructions {a:5d}-{min(a + step, len(data)) - 1:5d}: {100 * s / total:5.1f}% of samples, "
              f"{sum(ex[a : a + step]) / warps:7.1f} executed a warp")
    order = sorted(range(len(data)), key=lambda k: -smp[k])[:hottest]
    for k in sorted(order):
        print(f"  hot {k:5d} {100 * smp[k] / total:5.1f}%  {data[k][i_src].strip()[:80]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--regions", type=int, default=12)
    args = ap.parse_args()
    print(args.report)
    details(args.report)
    stalls(args.report)
    sass(args.report, args.regions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
