# The kernels before a GEMV make its x pairs (NINFER_NORM_PAIRS=1, written in the thirty-eighth
# session): the norm, over every K block (gemv_kw.norm_pairs_spread), and the GDN decode step for
# out_proj (gdn_decode_step's out_pairs) (~8 min warm, any card):
# 1. its GPU tests (bit-equal to rmsnorm + xpairs; the medium models' logits to the bit with the K-walk
#    and with the CUDA GEMV; graph = eager) and the cuda_fast fold tests (the fold test's fix, 37th session);
# 2. the 27B int4 8K plain step, default against NINFER_NORM_PAIRS=1, alternated twice;
# 3. the 35B-A3B int4 step the same way, then the 27B MTP round, in the time left (NP1_T, default 540).
# Prediction (H100): -0.13 to -0.22 ms on the 27B step (129 + 48 x-pairs launches of ~1-1.3 µs gone,
# the GDN step ~0.5 µs longer), -0.05 to -0.08 ms on the 35B's (41 + 30).
. bench/device_env.sh
t0=$(date +%s)
timeout 200 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_kw.py tests/plugins/cuda_fast/test_folds_gpu.py \
  -k "spread_norm or norm_pairs or folds or gdn_step" > "$OUT/t.txt" 2>&1
echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
V="X=1|NINFER_NORM_PAIRS=1|X=1|NINFER_NORM_PAIRS=1"
left=$(( ${NP1_T:-540} - ($(date +%s) - t0) ))
timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k --budget-s $(( left > 200 ? 150 : left - 15 )) \
  --variants "$V" > "$OUT/s27.txt" 2>&1
echo "27B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|^copy|ERROR|Error" "$OUT/s27.txt" | cut -c1-150
left=$(( ${NP1_T:-540} - ($(date +%s) - t0) ))
if [ $left -gt 70 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k --budget-s $(( left > 160 ? 100 : left - 15 )) \
    --variants "$V" > "$OUT/s35.txt" 2>&1
  echo "35B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|^copy|ERROR|Error" "$OUT/s35.txt" | cut -c1-150
fi
left=$(( ${NP1_T:-540} - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_NORM_PAIRS=1" > "$OUT/m.txt" 2>&1
  echo "round rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
