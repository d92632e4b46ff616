#!/bin/bash
# One device call (2026-12-04, eighth session): GPU tests of the Gluon f16x2 GEMV (gemv_h2g.py) and the
# direct tensor-core GEMV (gemv_tc.py, TCConfig.direct), then the direct kernel's tuning against the
# dispatch and the Gluon f16x2 A/B against gemv_h2's Triton kernel. Results under $OUT.
# The Gluon f16x2 GEMV lost that A/B and was dropped (BENCHMARKS.md "Tenth run"); its lines below
# no longer run (gemv_h2g.py, its tests and bench/h2g_ab.py are not in the tree).
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 200 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/quant_int/test_gemv_tc.py > "$OUT/t.txt" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
timeout 190 python3 bench/tc_tune.py --direct --out "$OUT/tc" --budget-s 150 \
  --pairs "q4_g64:27b.gate_up_merged,q5_g64:27b.down_proj,q5_g64:27b.in_proj_qkvz,q5_g64:27b.q_v_merged,q5_g64:27b.o_proj|out_proj,q4_g64:27b.k_proj|v_proj" \
  > "$OUT/tc.txt" 2>&1
echo "tc_tune rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^q|ERROR|===" "$OUT/tc.txt" | cut -c1-230
timeout 110 python3 bench/h2g_ab.py --out "$OUT/h2g" --budget-s 80 \
  --pairs "q4_g64:27b.gate_up_merged,q5_g64:27b.down_proj,q8_g32:35b.in_proj_qkvz,q8_g32:35b.o_proj|out_proj,q6_g64:35b.lm_head" \
  > "$OUT/h2g.txt" 2>&1
echo "h2g_ab rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^q|^nv|ERROR" "$OUT/h2g.txt" | cut -c1-260
