# The CUDA GEMV's tensor-core form (gemv_mma: q4/q5 at 1-4 x rows, mma.sync with the decoded pairs
# as A fragments; written in the thirty-sixth session without a GPU: 2.45-3.33 SASS instructions
# a q4 weight at any M <= 4 against 4.91 for the CUDA-core form at M = 4) (~7 min, any card):
# 1. its GPU tests (every built form at the 27B's and drafter's shapes and tails);
# 2. cu_gemv_bench over the verify's q4/q5 shapes at M = 4 and 2 (against the tensor-core K-walk);
# 3. the 27B int4 MTP round with those winners (NINFER_CU_TUNED) against the default
. bench/device_env.sh
t0=$(date +%s)
timeout 150 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py > "$OUT/t.txt" 2>&1
echo "CU GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
S="q4_g64:34816x5120,q5_g64:5120x17408,q5_g64:16384x5120,q5_g64:13312x5120,q5_g64:5120x6144,q4_g64:1024x5120"
timeout 200 python3 bench/cu_gemv_bench.py --out "$OUT" --ms 4,2 --budget-s 150 --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A30 "^best" "$OUT/b.txt" | cut -c1-160; grep -E "Error|error:" "$OUT/b.txt" | head -5
grep -E "^  q|cu mma" "$OUT/b.txt" | head -60 | cut -c1-120
TUNED="$OUT/tuned_cu.py"
[ -f "$TUNED" ] || echo "TUNED_CU = {}" > "$TUNED"
TUNED=$(realpath "$TUNED")
left=$(( ${CU10_T:-420} - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_CU_TUNED=$TUNED" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
