#!/bin/bash
# One device call (2026-12-04, ninth session): the 27B MTP round with down_proj's M = 4 / 8 entries
# at 17 K blocks a slice (tuned.TUNED_TC now) against the 8 before, alternated twice to see the
# run-to-run spread; then everything q4/q5 on the direct kernel (NINFER_TCD=1). Results under $OUT.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
run() {  # $1: label, $2: down's m4 entry (python tuple), $3...: env
  local label=$1 entry=$2; shift 2
  env "$@" timeout 110 python3 -c "
import runpy, sys
from ninfer_plugins.quant_int import tuned as T
T.TUNED_TC[(5, 5120, 17408, 'm4')] = $entry
sys.argv = ['dense_27b.py', '--skip-tests', '--only', 'int4_8k_mtp3_short']
runpy.run_path('bench/dense_27b.py', run_name='__main__')" > "$OUT/$label.txt" 2>&1
  echo "$label rc=$? $(( $(date +%s) - t0 )) s: $(tail -3 "$OUT/$label.txt" | head -2 | tr '\n' ' ' | cut -c1-330)"
}
run kb17_a "(17, 0, 4, 6, 2)" X=1
run kb8_a "(8, 0, 4, 6, 2)" X=1
run kb17_b "(17, 0, 4, 6, 2)" X=1
run kb8_b "(8, 0, 4, 6, 2)" X=1
run tcd "(17, 0, 4, 6, 2)" NINFER_TCD=1
