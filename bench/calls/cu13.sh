# gemv_mma with more K slices (U2 KS4, U1/U2 KS8, built in the thirty-seventh session for the verify's
# q5 down: 5120 rows x 17408 give 320 row groups of 16, 2.4 warps an SM at KS = 1; the tensor-core
# K-walk keeps it at 36.4 µs, 53.5% of an H100's copy) (~9 min, any card):
# 1. the CUDA GEMV's GPU tests (every built form, the new ones included);
# 2. cu_gemv_bench at M = 4 over the verify's q4/q5 shapes and the 27B's unmerged NVFP4 ones (gemv_mma for
#    NVFP4 is new too: 3.12 SASS instructions a weight at U2 against 5.27 for the CUDA-core form at M = 4) -> tuned_cu.py;
# 3. the 27B int4 MTP round with those winners (NINFER_CU_TUNED) against the default;
# 4. if time is left (CU13_T, default 540): the 27B nvfp4 step against NINFER_NV_MERGE=1 (the merge
#    with the unmerged shapes' winners in the table: predicted -0.3 ms), then the 27B int4 plain
#    step's kernel profile (where the q6 head winner's expected -0.06 ms went)
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
left=$(( ${CU13_T:-540} - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left > 230 ? 150 : left - 15 )) \
    --variants "X=1|NINFER_CU_TUNED=$TUNED" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
left=$(( ${CU13_T:-540} - ($(date +%s) - t0) ))
if [ $left -gt 90 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s $(( left > 180 ? 100 : left - 15 )) \
    --variants "X=1|NINFER_NV_MERGE=1" > "$OUT/s.txt" 2>&1
  echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
fi
left=$(( ${CU13_T:-540} - ($(date +%s) - t0) ))
if [ $left -gt 60 ]; then
  timeout $left python3 bench/profile_step.py --graph --model qwen3.6-27b --quant int4 --gen-len 16 --rows 40 \
    --out "$OUT/p" > "$OUT/p.txt" 2>&1
  echo "profile rc=$? $(( $(date +%s) - t0 )) s"; head -48 "$OUT/p.txt" | cut -c1-160
  # a call brings back 8 files: the profile joins the step's text (the Triton cache may be two)
  cat "$OUT/p.txt" >> "$OUT/s.txt"; rm -rf "$OUT/p" "$OUT/p.txt"
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
