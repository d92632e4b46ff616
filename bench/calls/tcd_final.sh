#!/bin/bash
# Last device call of 2026-12-04 (eighth session): the direct tensor-core GEMV as committed (the SwiGLU fold
# removed): its GPU tests, the speculative verify and graph tests, then the MTP round. Results under $OUT.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 290 python3 -m pytest -q -rf -m gpu -n 8 tests/plugins/quant_int/test_gemv_tc.py tests/plugins/spec_mtp/test_spec_gpu.py \
  tests/core/test_graphs.py > "$OUT/t.txt" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
timeout 100 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp.txt" 2>&1
echo "mtp rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/mtp.txt" | head -2
