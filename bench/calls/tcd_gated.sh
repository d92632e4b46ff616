#!/bin/bash
# One device call (2026-12-04, eighth session): the direct tensor-core GEMV with the SwiGLU folded in and its
# last-CTA sum over M's tokens only; GPU tests, the gated A/B on the down projection, the direct kernel's
# tuning on down / o_proj / q_v, the 27B plain step (qkvz M = 1 back on the f16x2 GEMV) and the MTP round with
# the folded down projection (default) and without (NINFER_TCD_GATED=0). Results under $OUT.
# Ran at commit 099725c. The fold lost and was removed in the next commit, along with
# bench/tcd_gated_ab.py and NINFER_TCD_GATED (BENCHMARKS.md "Tenth run"), so this script no longer runs as is.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 150 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/quant_int/test_gemv_tc.py > "$OUT/t.txt" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
timeout 60 python3 bench/tcd_gated_ab.py > "$OUT/gated.txt" 2>&1
echo "gated ab rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/gated.txt" | grep -v Warn | tail -6
timeout 80 python3 bench/tc_tune.py --direct --out "$OUT/tc" --budget-s 50 \
  --pairs "q5_g64:27b.down_proj,q5_g64:27b.o_proj|out_proj,q5_g64:27b.q_v_merged" > "$OUT/tc.txt" 2>&1
echo "tc_tune rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^q|ERROR" "$OUT/tc.txt" | cut -c1-230 | head -4
B="ninfer bench --model qwen3.6-27b --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
timeout 100 $B --json "$OUT/b27.json" > "$OUT/b27.txt" 2>&1
echo "27B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "decode|roofline" "$OUT/b27.txt"
timeout 100 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp.txt" 2>&1
echo "mtp rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/mtp.txt" | head -2
NINFER_TCD_GATED=0 timeout 100 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp_ng.txt" 2>&1
echo "mtp (down not folded at M = 4) rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/mtp_ng.txt" | head -2
