#!/bin/bash
# Fourteenth run, call A: the commit kernel alone, then the 27B MTP round (K = 3, shortlist head)
# as committed / NINFER_GDN_COMMIT=0 / NINFER_ROUND_IO=0, alternated twice in one process.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 60 python3 -m pytest -q -rf tests/core/kernels/test_triton_argmax.py > "$OUT/t.txt" 2>&1
echo "argmax on CUDA rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"
timeout 45 python3 bench/commit_bench.py > "$OUT/commit.txt" 2>&1; echo "commit_bench rc=$?"; cat "$OUT/commit.txt"
timeout 470 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s 380 \
  --variants "X=1|NINFER_GDN_COMMIT=0|NINFER_ROUND_IO=0|X=1|NINFER_GDN_COMMIT=0|NINFER_ROUND_IO=0" > "$OUT/m.txt" 2>&1
echo "rounds rc=$? $(( $(date +%s) - t0 )) s"
grep -E "spec round|^int4|^skipped|ERROR|Error" "$OUT/m.txt" | cut -c1-170
