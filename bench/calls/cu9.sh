# cu_gemv_bench over the shapes the default models run that the thirty-sixth session's benches did
# not time (~5 min, any card): the 27B's and 35B's NVFP4 projections as they run unmerged (the
# default: NINFER_NV_MERGE is off), the q6 heads (Qwen3.6-27B and 35B-A3B int4; q6 in the CUDA
# GEMV since the thirty-sixth session, never run), the q8 heads (Qwen3.8-27B int4, the nvfp4
# recipes) and the MTP shortlist head (q4), at M = 1 and 4 -> tuned_cu.py (winners to paste into tuned.TUNED_CU); then
# the 27B nvfp4 step with them against the default
. bench/device_env.sh
t0=$(date +%s)
S="nvfp4:17408x5120,nvfp4:10240x5120,nvfp4:6144x5120,nvfp4:12288x5120,nvfp4:1024x5120,nvfp4:8192x2048"
S="$S,nvfp4:4096x2048,nvfp4:512x2048,nvfp4:2048x4096,q8_g32:248320x5120,q8_g32:248320x2048,q4_g64:131072x5120"
S="$S,q6_g64:248320x5120,q6_g64:248320x2048"
timeout 230 python3 bench/cu_gemv_bench.py --out "$OUT" --ms 1,4 --budget-s 180 --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A60 "^best" "$OUT/b.txt" | cut -c1-160; grep -E "Error|error:" "$OUT/b.txt" | head -5
TUNED="$OUT/tuned_cu.py"
[ -f "$TUNED" ] || echo "TUNED_CU = {}" > "$TUNED"
TUNED=$(realpath "$TUNED")
left=$(( ${CU9_T:-300} - ($(date +%s) - t0) ))
if [ $left -gt 70 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_CU_TUNED=$TUNED" > "$OUT/s.txt" 2>&1
  echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
