#!/bin/bash
# One device call (2026-12-04, tenth session): the delta rule's paired reductions (NINFER_GDN_PAIRED=1,
# two passes through shared memory a token instead of four). GPU tests of the GDN kernels both ways and
# the speculative GPU tests with it; bench/gdn_columns.py (verify columns and the decode step, both ways);
# the 27B MTP round (plain step and round in one process) alternated twice between the two.
set -u
. "$(dirname "$0")/../device_env.sh"
t0=$(date +%s)
timeout 200 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_gdn.py > "$OUT/t.txt" 2>&1
echo "gdn tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
NINFER_GDN_PAIRED=1 timeout 200 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/spec_mtp/test_spec_gpu.py > "$OUT/t2.txt" 2>&1
echo "spec tests (paired) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t2.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t2.txt" | head
timeout 100 python3 bench/gdn_columns.py --variants 32:4,32:4:p,128:4,128:4:p,16:2,16:2:p,64:4:p \
  --decode-variants 128:4,128:4:p,128:4,128:4:p > "$OUT/gdn.txt" 2>&1
echo "gdn_columns rc=$? $(( $(date +%s) - t0 )) s"; grep -E "columns|decode step|MISMATCH|max diff" "$OUT/gdn.txt"
for e in "NINFER_GDN_PAIRED=0" "NINFER_GDN_PAIRED=1" "NINFER_GDN_PAIRED=0" "NINFER_GDN_PAIRED=1"; do
  env $e timeout 100 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/m.txt" 2>&1
  echo "$e rc=$? $(( $(date +%s) - t0 )) s: $(tail -3 "$OUT/m.txt" | head -2 | tr '\n' ' ' | cut -c1-300)"
done
