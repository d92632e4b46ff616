# One call for the CUDA C++ GEMV (quant_int/gemv_cu.cu, written without a GPU in the thirty-fifth
# session): its GPU tests, bench/cu_gemv_bench.py against the dispatched kernels at M = 1 and 4,
# the 27B int4 plain step with NINFER_CU_GEMV=1 alternated with the tree as committed, then the
# MTP round with NINFER_CU_GEMV=4 (M = 1-4 launches) if time is left (~9 min cold)
. bench/device_env.sh
t0=$(date +%s)
T=${CU3_T:-540}
nvcc --version | tail -1
if [ "${CU3_TEST:-130}" != 0 ]; then
  timeout ${CU3_TEST:-130} python3 -m pytest -q -rf -m gpu -x -n 2 tests/plugins/quant_int/test_gemv_cu.py > "$OUT/t.txt" 2>&1
  echo "CU GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/t.txt" | head -20
fi
timeout $(( ${CU3_BB:-170} + 60 )) python3 bench/cu_gemv_bench.py --out "$OUT" --ms ${CU3_MS:-1,4} --budget-s ${CU3_BB:-170} ${CU3_SHAPES:+--shapes $CU3_SHAPES} > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A40 "^best" "$OUT/b.txt" | cut -c1-160; grep -E "Error|error" "$OUT/b.txt" | head -5
# the step runs with the winners the bench just found (an empty table if it found none)
TUNED="$OUT/tuned_cu.py"
[ -f "$TUNED" ] || echo "TUNED_CU = {}" > "$TUNED"
TUNED=$(realpath "$TUNED")
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 120 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k --budget-s $(( left - 30 )) \
    --variants "X=1|NINFER_CU_GEMV=1 NINFER_CU_TUNED=$TUNED|X=1|NINFER_CU_GEMV=1 NINFER_CU_TUNED=$TUNED" > "$OUT/s.txt" 2>&1
  echo "step rc=$? $(( $(date +%s) - t0 )) s"; sed -n "/=== dense/,$p" "$OUT/s.txt" | cut -c1-170 | head -14; grep -E "Error" "$OUT/s.txt" | head -3
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 100 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 25 )) \
    --variants "X=1|NINFER_CU_GEMV=4 NINFER_CU_TUNED=$TUNED" > "$OUT/m.txt" 2>&1
  echo "rounds $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-150
fi
# a call brings back 8 files: b.txt and tuned_cu.py hold the bench's figures, dense_27b.json the runs'
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
pack_triton_cache
