#!/bin/bash
# Nsight Compute on the tensor-core decode GEMV (gemv_tc.py): the limiter hunt of BENCHMARKS.md.
#   bash bench/ncu_tc.sh OUTDIR "scheme n k m kb,stages,warps,ctas" ...
# Per case: SpeedOfLight, WarpStateStats, SchedulerStats, Occupancy, MemoryWorkloadAnalysis,
# SourceCounters (the top stall sites) of the fourth launch, to OUTDIR/<n>.txt.
out=$1; shift
mkdir -p "$out"
i=0
for case in "$@"; do
  set -- $case
  i=$((i + 1))
  timeout 120 ncu --clock-control none -k regex:_gemv_tc_kernel -s 3 -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats \
    python3 bench/ncu_linear.py --scheme "$1" --n "$2" --k "$3" --m "$4" --path tc --tc "$5" > "$out/$i.txt" 2>&1
  echo "== case $i: $case"
  grep -E "rel err|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Static Shared|Warp Cycles Per Issued|No Eligible|Stall|stall" "$out/$i.txt" | head -40
done
