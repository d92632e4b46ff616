# Thirty-sixth session, second call (~8 min, any card): the CUDA C++ GEMV's measured winners are
# the default now (tuned.TUNED_CU, from cu3's H100 bench). Its GPU tests plus the model GPU tests
# with NINFER_CU_GEMV=4 (the kernel at every q4/q5/q8 launch of 1-4 rows that it can take, the tiny
# models' shapes included), then the 27B int4 MTP round and plain step, the default alternated with
# NINFER_CU_GEMV=0 (the tree before), then the 27B int8 step and the 35B int4 step, each against NINFER_CU_GEMV=0, if time is left
. bench/device_env.sh
t0=$(date +%s)
T=${CU4_T:-540}
NINFER_CU_GEMV=4 timeout ${CU4_TEST:-170} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py \
  tests/plugins/spec_mtp/test_spec_gpu.py tests/core/test_graphs.py tests/plugins/cuda_fast/test_dense_gemv.py \
  tests/plugins/cuda_fast/test_fused_path.py > "$OUT/t.txt" 2>&1
echo "GPU tests (NINFER_CU_GEMV=4) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
left=$(( T - ($(date +%s) - t0) ))
timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 25 )) \
  --variants "X=1|NINFER_CU_GEMV=0|X=1|NINFER_CU_GEMV=0" > "$OUT/m.txt" 2>&1
echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 90 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int8_8k --budget-s $(( left - 20 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/s.txt" 2>&1
  echo "27B int8 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int8|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 90 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k --budget-s $(( left - 20 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/s35.txt" 2>&1
  echo "35B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|ERROR" "$OUT/s35.txt" | cut -c1-150
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
pack_triton_cache
