#!/bin/bash
# One device call (2026-12-04, tenth session): the verify columns' conv inputs loaded a token ahead
# (NINFER_GDN_AHEAD=1, with the paired reductions that are now the default): GPU tests of the GDN
# kernels three ways, the speculative GPU tests with it, bench/gdn_columns.py, and the 27B MTP round alternated twice without and with it.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 200 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_gdn.py > "$OUT/t.txt" 2>&1
echo "gdn tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
NINFER_GDN_AHEAD=1 timeout 150 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/spec_mtp/test_spec_gpu.py > "$OUT/t2.txt" 2>&1
echo "spec tests (ahead) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t2.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t2.txt" | head
timeout 100 python3 bench/gdn_columns.py --variants 32:4:p,32:4:pa,32:4:p,32:4:pa,16:2:pa,64:4:pa \
  --decode-variants 128:4:p > "$OUT/gdn.txt" 2>&1
echo "gdn_columns rc=$? $(( $(date +%s) - t0 )) s"; grep -E "columns|decode step|MISMATCH|max diff" "$OUT/gdn.txt"
for e in "NINFER_GDN_AHEAD=0" "NINFER_GDN_AHEAD=1" "NINFER_GDN_AHEAD=0" "NINFER_GDN_AHEAD=1"; do
  env $e timeout 100 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/m.txt" 2>&1
  echo "$e rc=$? $(( $(date +%s) - t0 )) s: $(tail -3 "$OUT/m.txt" | head -2 | tr '\n' ' ' | cut -c1-300)"
done
