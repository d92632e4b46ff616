# Thirty-sixth session (~9 min, any card): the CUDA C++ GEMV's measured winners are the default now
# (tuned.TUNED_CU from cu3's H100 bench), and the kernel takes NVFP4 too (written this session).
# 1. its GPU tests (NVFP4 included) and the model GPU tests with NINFER_CU_GEMV=4 (the kernel at
#    every q4/q5/q8/NVFP4 launch of 1-4 rows it can take, the tiny models' shapes included);
# 2. cu_gemv_bench over the NVFP4 shapes of the 27B and 35B-A3B at M = 1 and 4 (-> tuned_cu.py);
# 3. the 27B nvfp4 step with those winners against the default (no NVFP4 entries yet), alternated;
# 4. the 27B int4 MTP round and plain step, the default against NINFER_CU_GEMV=0;
# 5. the 35B-A3B int4 step, the default against NINFER_CU_GEMV=0, if time is left
. bench/device_env.sh
t0=$(date +%s)
T=${CU5_T:-540}
NINFER_CU_GEMV=4 timeout ${CU5_TEST:-200} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py \
  tests/plugins/spec_mtp/test_spec_gpu.py tests/core/test_graphs.py tests/plugins/cuda_fast/test_dense_gemv.py \
  tests/plugins/cuda_fast/test_fused_path.py > "$OUT/t.txt" 2>&1
echo "GPU tests (NINFER_CU_GEMV=4) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
NV="nvfp4:34816x5120,nvfp4:5120x17408,nvfp4:16384x5120,nvfp4:13312x5120,nvfp4:5120x6144,nvfp4:12288x2048,nvfp4:9216x2048"
timeout 150 python3 bench/cu_gemv_bench.py --out "$OUT" --ms 1,4 --budget-s 100 --shapes $NV > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A40 "^best" "$OUT/b.txt" | cut -c1-160; grep -E "Error|error:" "$OUT/b.txt" | head -5
TUNED="$OUT/tuned_cu.py"
[ -f "$TUNED" ] || echo "TUNED_CU = {}" > "$TUNED"
TUNED=$(realpath "$TUNED")
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 100 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s $(( left - 20 )) \
    --variants "X=1|NINFER_CU_TUNED=$TUNED|X=1|NINFER_CU_TUNED=$TUNED" > "$OUT/s.txt" 2>&1
  echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 100 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 20 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/s35.txt" 2>&1
  echo "35B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|ERROR" "$OUT/s35.txt" | cut -c1-150
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
pack_triton_cache
