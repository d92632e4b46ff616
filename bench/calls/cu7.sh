# cu6 cut to fit ~330 s (thirty-sixth session's last device time): the captured-round tests and the
# CUDA GEMV's tests under NINFER_CU_GEMV=4 (the late PDL trigger), the 27B int4 MTP round and the
# 27B nvfp4 step as committed (their NINFER_CU_GEMV=0 baselines are cu5's), then the nvfp4 step's
# profile if time is left
. bench/device_env.sh
t0=$(date +%s)
T=${CU7_T:-330}
NINFER_CU_GEMV=4 timeout ${CU7_TEST:-150} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py \
  tests/plugins/spec_mtp/test_spec_gpu.py -k "captured or gemv_cu" > "$OUT/t.txt" 2>&1
echo "GPU tests (NINFER_CU_GEMV=4) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
left=$(( T - ($(date +%s) - t0) ))
timeout $(( left > 90 ? 90 : left )) python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s 70 > "$OUT/m.txt" 2>&1
echo "round rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
left=$(( T - ($(date +%s) - t0) ))
timeout $(( left > 60 ? 60 : left )) python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s 45 > "$OUT/s.txt" 2>&1
echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 40 ]; then
  timeout $left python3 bench/profile_step.py --graph --model qwen3.6-27b --quant nvfp4 --gen-len 16 --rows 40 --out "$OUT/p" > "$OUT/p.txt" 2>&1
  echo "profile rc=$? $(( $(date +%s) - t0 )) s"; head -48 "$OUT/p.txt" | cut -c1-160
  rm -rf "$OUT/p"
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
