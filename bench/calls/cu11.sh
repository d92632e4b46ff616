# The thirty-seventh session's first call (~9.5 min, any card): cu8's and cu10's most needed parts in
# one call, since machines come rarely (eight refused or failed starts before it):
# 1. GPU tests under NINFER_CU_GEMV=4: the CUDA GEMV's (its tensor-core form gemv_mma included, never
#    run), the captured-round tests (two failed before the PDL fix of the thirty-sixth session), the
#    graph tests;
# 2. cu_gemv_bench at M = 4 over the verify's big q4/q5 shapes (gemv_mma against the tensor-core
#    K-walk) -> tuned_cu.py;
# 3. the 27B int4 MTP round: the default against those winners (NINFER_CU_TUNED);
# 4. on an H200 only, if time is left: the 27B int4 plain step, the default against NINFER_CU_GEMV=0
. bench/device_env.sh
t0=$(date +%s)
T=${CU11_T:-560}
NINFER_CU_GEMV=4 timeout ${CU11_TEST:-180} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py \
  tests/plugins/spec_mtp/test_spec_gpu.py tests/core/test_graphs.py -k "captured or gemv_cu or graph or mma or config" > "$OUT/t.txt" 2>&1
echo "GPU tests (NINFER_CU_GEMV=4) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
S="q4_g64:34816x5120,q5_g64:5120x17408,q5_g64:16384x5120,q5_g64:13312x5120"
timeout 150 python3 bench/cu_gemv_bench.py --out "$OUT" --ms 4 --budget-s 120 --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A20 "^best" "$OUT/b.txt" | cut -c1-170; grep -E "Error|error:" "$OUT/b.txt" | head -5
TUNED="$OUT/tuned_cu.py"
[ -f "$TUNED" ] || echo "TUNED_CU = {}" > "$TUNED"
TUNED=$(realpath "$TUNED"); cat "$TUNED"
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left > 200 ? 170 : left - 15 )) \
    --variants "X=1|NINFER_CU_TUNED=$TUNED" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 70 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/s.txt" 2>&1
  echo "27B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
