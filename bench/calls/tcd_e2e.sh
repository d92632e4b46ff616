#!/bin/bash
# One device call (2026-12-04, eighth session): the direct tensor-core GEMV's TUNED_TC winners end to end.
# GPU tests (the direct kernel's configs, the dispatched tuned table in a CUDA graph, the speculative verify,
# graph = eager), the 27B int4 plain step and the MTP round (K = 3). Results under $OUT.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 180 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/quant_int/test_gemv_tc.py tests/plugins/spec_mtp/test_spec_gpu.py \
  tests/core/test_graphs.py > "$OUT/t.txt" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
B="ninfer bench --model qwen3.6-27b --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
timeout 120 $B --json "$OUT/b27.json" > "$OUT/b27.txt" 2>&1
echo "27B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "decode|roofline" "$OUT/b27.txt"
timeout 170 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp.txt" 2>&1
echo "mtp rc=$? $(( $(date +%s) - t0 )) s"; tail -6 "$OUT/mtp.txt"
