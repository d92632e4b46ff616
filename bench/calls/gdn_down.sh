#!/bin/bash
# One device call (2026-12-04, ninth session): the GDN verify columns per value block / warps
# (bench/gdn_columns.py) and the verify's q5 down projection and q4 gate+up ranked at M = 4 over
# wider K slices (bench/tc_tune.py --rank-m 4). Results under $OUT.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 150 python3 bench/gdn_columns.py > "$OUT/gdn.txt" 2>&1
echo "gdn_columns rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/gdn.txt"
timeout 200 python3 bench/tc_tune.py --out "$OUT/down" --budget-s 170 --rank-m 4 --pairs "q5_g64:27b.down_proj" \
  --cands "8:0:4:6:2,8:0:4:4:2,8:0:4:8:2,8:0:8:3:2,8:0:2:12:2,8:0:4:6:1,4:0:4:6:2,17:0:4:6:2,17:0:4:4:1,17:0:4:8:2,17:0:8:3:2,17:0:2:8:2,34:0:4:4:1,34:0:4:6:1" \
  > "$OUT/down.txt" 2>&1
echo "down rc=$? $(( $(date +%s) - t0 )) s"; grep -E "M=4:|^q|ERROR" "$OUT/down.txt" | cut -c1-900
timeout 120 python3 bench/tc_tune.py --out "$OUT/gu" --budget-s 90 --rank-m 4 --pairs "q4_g64:27b.gate_up_merged" \
  --cands "8:2:4:2:0,4:0:4:6:2,8:0:4:4:2,5:0:4:6:2,10:0:4:4:2,10:0:4:6:1,5:0:8:3:2,10:0:8:2:2,8:0:8:3:2" \
  > "$OUT/gu.txt" 2>&1
echo "gate_up rc=$? $(( $(date +%s) - t0 )) s"; grep -E "M=4:|^q|ERROR" "$OUT/gu.txt" | cut -c1-900
