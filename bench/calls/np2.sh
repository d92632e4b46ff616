# np1 in the order a short budget wants (thirty-eighth session, ~600 s of device time left): the 27B int4
# step A/B first (NINFER_NORM_PAIRS=1 against the default, alternated), then the GPU tests of what it
# runs, then the 35B-A3B step A/B in the time left (NP2_T, default 480).
. bench/device_env.sh
t0=$(date +%s)
V="X=1|NINFER_NORM_PAIRS=1|X=1|NINFER_NORM_PAIRS=1"
timeout 230 python3 bench/dense_27b.py --skip-tests --only int4_8k --budget-s 200 --variants "$V" > "$OUT/s27.txt" 2>&1
echo "27B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|^copy|ERROR|Error" "$OUT/s27.txt" | cut -c1-150
left=$(( ${NP2_T:-480} - ($(date +%s) - t0) ))
if [ $left -gt 60 ]; then
  timeout $(( left > 170 ? 150 : left - 10 )) python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_kw.py \
    tests/plugins/cuda_fast/test_folds_gpu.py -k "spread_norm or norm_pairs or folds or gdn_step" > "$OUT/t.txt" 2>&1
  echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
fi
left=$(( ${NP2_T:-480} - ($(date +%s) - t0) ))
if [ $left -gt 70 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_NORM_PAIRS=1" > "$OUT/s35.txt" 2>&1
  echo "35B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|^copy|ERROR|Error" "$OUT/s35.txt" | cut -c1-150
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
