# The one-token bf16 GEMV (cuda_fast/dense_gemv.py, written without a GPU): its GPU tests, the
# microbench against cuBLAS (bench/dense_gemv_bench.py), then the 27B bf16 step with it on the gated
# down projection and on every one-token projection but the head, alternated with the tree as
# committed (F.linear + SwiGLU), with the microbench's best down config (~4.5 min on a warm H200)
. bench/device_env.sh
t0=$(date +%s)
timeout ${DG_T:-50} python3 -m pytest -q -rf -m gpu tests/plugins/cuda_fast/test_dense_gemv.py > "$OUT/t.txt" 2>&1
echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
timeout ${DG_B:-75} python3 bench/dense_gemv_bench.py --budget-s $(( ${DG_B:-75} - 15 )) > "$OUT/db.txt" 2>&1
echo "dense_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^    BN" "$OUT/db.txt" | cut -c1-150; grep -E "^    BN" "$OUT/db.txt" | head -14 | cut -c1-100
CFG=$(grep -o "NINFER_DENSE_GEMV_CFG=[0-9:]*" "$OUT/db.txt" | cut -d= -f2); CFG=${CFG:-8:512:4}
left=$(( ${DG_S:-290} - ($(date +%s) - t0) ))
timeout $left python3 bench/dense_27b.py --skip-tests --only bf16_8k_alone --budget-s $(( left - 25 )) \
  --variants "${DG_V:-X=1|NINFER_DENSE_GEMV=gated NINFER_DENSE_GEMV_CFG=$CFG|NINFER_DENSE_GEMV=all NINFER_DENSE_GEMV_CFG=$CFG|X=1}" \
  > "$OUT/bf.txt" 2>&1
echo "27B bf16 rc=$? $(( $(date +%s) - t0 )) s (cfg $CFG)"; grep -E "^bf16|^skipped|ERROR|Error" "$OUT/bf.txt" | cut -c1-160
