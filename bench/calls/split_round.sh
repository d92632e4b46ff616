#!/bin/bash
# One device call (2026-12-04, ninth session), after the GDN verify split its heads
# (gdn.split_heads) and down_proj took 17 K blocks a slice at M = 4 / 8 (tuned.TUNED_TC): GPU tests
# of both, the 27B MTP round, and the M = 1 decode step whole against split. Results under $OUT.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 260 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_gdn.py tests/plugins/quant_int/test_gemv_tc.py \
  tests/plugins/spec_mtp/test_spec_gpu.py > "$OUT/t.txt" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
timeout 150 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp.txt" 2>&1
echo "mtp rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/mtp.txt" | head -2
NINFER_GDN_SPLIT=0 timeout 120 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp_whole.txt" 2>&1
echo "mtp, heads whole rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/mtp_whole.txt" | head -2
timeout 100 python3 bench/gdn_columns.py --variants 128:4,32:4 --decode-variants 128:4,128:8,64:4,32:4,32:2,16:2 > "$OUT/gdn.txt" 2>&1
echo "gdn rc=$? $(( $(date +%s) - t0 )) s"; grep -v MISMATCH "$OUT/gdn.txt"
