# gemv_mma with more K slices (U2 KS4, U1/U2 KS8, built in the thirty-seventh session for the verify's
# q5 down: 5120 rows x 17408 give 320 row groups of 16, 2.4 warps an SM at KS = 1; the tensor-core
# K-walk keeps it at 36.4 µs, 53.5% of an H100's copy) (~6 min, any card):
# 1. the CUDA GEMV's GPU tests (every built form, the new ones included);
# 2. cu_gemv_bench at M = 4 over the verify's q4/q5 shapes and the 27B's unmerged NVFP4 ones (gemv_mma for
#    NVFP4 is new too: 3.12 SASS instructions a weight at U2 against 5.27 for the CUDA-core form at M = 4) -> tuned_cu.py;
# 3. the 27B int4 MTP round with those winners (NINFER_CU_TUNED) against the default
. bench/device_env.sh
t0=$(date +%s)
timeout 150 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py > "$OUT/t.txt" 2>&1
echo "CU GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
S="q5_g64:5120x17408,q4_g64:34816x5120,q5_g64:16384x5120,q5_g64:13312x5120,q5_g64:5120x6144,q4_g64:131072x5120"
S="$S,nvfp4:17408x5120,nvfp4:5120x17408,nvfp4:10240x5120,nvfp4:12288x5120,nvfp4:6144x5120"
timeout 150 python3 bench/cu_gemv_bench.py --out "$OUT" --ms 4 --budget-s 120 --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A14 "^best" "$OUT/b.txt" | cut -c1-170; grep -E "Error|error:" "$OUT/b.txt" | head -5
grep -E "cu mma" "$OUT/b.txt" | head -40 | cut -c1-120
TUNED="$OUT/tuned_cu.py"
[ -f "$TUNED" ] || echo "TUNED_CU = {}" > "$TUNED"
TUNED=$(realpath "$TUNED"); cat "$TUNED"
left=$(( ${CU13_T:-380} - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_CU_TUNED=$TUNED" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
