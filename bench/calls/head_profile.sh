#!/bin/bash
# One device call (2026-12-04, tenth session): the 27B q6 head's M = 1 entry, h2_tune's winner
# (BN16 KBS8 C6 early, tuned.TUNED_H2 now) against the one before (BN32 KBS8 C4), alternated twice,
# plain step and MTP round in each; then graph profiles with PDL off (kernel times that do not
# overlap) of the plain step and of the MTP round, to split the round's excess by kernel.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
run() {  # $1: label, $2: the head's m1 entry (python tuple)
  local label=$1 entry=$2
  timeout 110 python3 -c "
import runpy, sys
from ninfer_plugins.quant_int import tuned as T
T.TUNED_H2[(6, 248320, 5120, 'm1')] = $entry
sys.argv = ['dense_27b.py', '--skip-tests', '--only', 'int4_8k_mtp3_short']
runpy.run_path('bench/dense_27b.py', run_name='__main__')" > "$OUT/$label.txt" 2>&1
  echo "$label rc=$? $(( $(date +%s) - t0 )) s: $(tail -3 "$OUT/$label.txt" | head -2 | tr '\n' ' ' | cut -c1-330)"
}
run new_a "(16, 8, 6, 4, 1, True)"
run old_a "(32, 8, 4, 4, 1, False)"
run new_b "(16, 8, 6, 4, 1, True)"
run old_b "(32, 8, 4, 4, 1, False)"
P="python3 bench/profile_step.py --graph --model qwen3.6-27b --quant int4 --gen-len 16 --rows 45"
NINFER_PDL=0 timeout 150 $P --out "$OUT/p_plain" > "$OUT/p_plain.txt" 2>&1; echo "profile plain (PDL off) rc=$? $(( $(date +%s) - t0 )) s"
NINFER_PDL=0 timeout 180 $P --out "$OUT/p_mtp" --spec mtp --draft-tokens 3 --lm-head-draft > "$OUT/p_mtp.txt" 2>&1
echo "profile MTP round (PDL off) rc=$? $(( $(date +%s) - t0 )) s"
