#!/bin/bash
# Fourteenth run, call B: the 35B-A3B plain step with the sampler doing the step's tail (default)
# against NINFER_STEP_TAIL=0, alternated twice in one process; the 27B MTP round with the forced
# verify split (BV 16, 2 warps) with and without the conv inputs ahead; then the read ceiling.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 200 python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k --budget-s 150 \
  --variants "X=1|NINFER_STEP_TAIL=0|X=1|NINFER_STEP_TAIL=0" > "$OUT/b.txt" 2>&1
echo "35B tail A/B rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^int4_8k|^skipped|ERROR|Error" "$OUT/b.txt" | cut -c1-170
timeout 170 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s 120 \
  --variants "X=1|NINFER_GDN_VERIFY_BV=16:2|NINFER_GDN_VERIFY_BV=16:2 NINFER_GDN_AHEAD=1|X=1|NINFER_GDN_VERIFY_BV=16:2" > "$OUT/m.txt" 2>&1
echo "rounds rc=$? $(( $(date +%s) - t0 )) s"
grep -E "spec round|^skipped|ERROR|Error" "$OUT/m.txt" | cut -c1-150
timeout 190 python3 bench/read_ceiling.py --out "$OUT" > "$OUT/ceiling.txt" 2>&1
echo "read_ceiling rc=$? $(( $(date +%s) - t0 )) s"; sed -n '/best per shape/,$p' "$OUT/ceiling.txt" | head -40
