# The 35B-A3B's q8 projections on the CUDA GEMV (~6 min, any card). On the H200 (thirty-fourth run)
# the 35B step's out_proj / o_proj ran on the f16x2 GEMV at ~6.9 µs a launch (40 a step, 274 µs:
# ~1.3 TB/s on a 8.9 MB q8 matrix); its q+gate+k+v, the shared expert's projections and the q6 head
# never had a CUDA GEMV config timed. cu_gemv_bench over those at M = 1 and 4 -> tuned_cu.py (merged
# with the committed table by NINFER_CU_TUNED), then the 35B int4 step and round with them against
# the default
. bench/device_env.sh
t0=$(date +%s)
S="q8_g32:2048x4096,q8_g32:9216x2048,q8_g32:1024x2048,q8_g32:2048x512,q6_g64:248320x2048,q4_g64:131072x2048"
timeout 200 python3 bench/cu_gemv_bench.py --out "$OUT" --ms 1,4 --budget-s 160 --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A40 "^best" "$OUT/b.txt" | cut -c1-170; grep -E "Error|error:" "$OUT/b.txt" | head -5
TUNED="$OUT/tuned_cu.py"
[ -f "$TUNED" ] || echo "TUNED_CU = {}" > "$TUNED"
TUNED=$(realpath "$TUNED"); cat "$TUNED"
left=$(( ${CU12_T:-380} - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k,int4_8k_mtp3_short \
    --budget-s $(( left - 15 )) --variants "X=1|NINFER_CU_TUNED=$TUNED" > "$OUT/s.txt" 2>&1
  echo "35B rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|spec round|^skipped|ERROR" "$OUT/s.txt" | cut -c1-170
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
