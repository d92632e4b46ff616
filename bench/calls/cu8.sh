# Next session's first call (~9 min, any card). The thirty-sixth session made the CUDA C++ GEMV the
# default on its H100 winners (tuned.TUNED_CU, q4/q5/q8 and NVFP4), then fixed its PDL trigger inside
# launch.late_dependents() (it triggered at its start; the GDN step, which reads its state before
# its wait, could read a state the round's commit was still writing) with no device time left to
# re-test. It also put NVFP4 row merging behind NINFER_NV_MERGE=1 (the merged gate+up read at 90%
# of copy by the CUDA GEMV).
# 1. GPU tests under NINFER_CU_GEMV=4 (the kernel at every launch of 1-4 rows it can take): the
#    CUDA GEMV's, the captured-round tests (two failed before the fix), the graph tests; then the
#    graph tests again with NINFER_NV_MERGE=1;
# 2. the 27B int4 MTP round and plain step, the default against NINFER_CU_GEMV=0;
# 3. the 27B nvfp4 step: the default, NINFER_NV_MERGE=1 (merged where TUNED_CU has the merged
#    shape), =all, NINFER_CU_GEMV=0;
# 4. the nvfp4 step's kernel profile with NINFER_NV_MERGE=1, if time is left
. bench/device_env.sh
t0=$(date +%s)
T=${CU8_T:-540}
NINFER_CU_GEMV=4 timeout ${CU8_TEST:-170} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py \
  tests/plugins/spec_mtp/test_spec_gpu.py tests/core/test_graphs.py -k "captured or gemv_cu or graph" > "$OUT/t.txt" 2>&1
echo "GPU tests (NINFER_CU_GEMV=4) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
NINFER_CU_GEMV=4 NINFER_NV_MERGE=1 timeout 90 python3 -m pytest -q -rf -m gpu -n $NW tests/core/test_graphs.py > "$OUT/t2.txt" 2>&1
echo "graph tests (NINFER_NV_MERGE=1) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t2.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t2.txt" | head
cat "$OUT/t2.txt" >> "$OUT/t.txt"; rm -f "$OUT/t2.txt"
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 100 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 20 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 90 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_NV_MERGE=1|NINFER_NV_MERGE=all|NINFER_CU_GEMV=0" > "$OUT/s.txt" 2>&1
  echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 50 ]; then
  NINFER_NV_MERGE=1 timeout $left python3 bench/profile_step.py --graph --model qwen3.6-27b --quant nvfp4 --gen-len 16 --rows 40 \
    --out "$OUT/p" > "$OUT/p.txt" 2>&1
  echo "profile rc=$? $(( $(date +%s) - t0 )) s"; head -48 "$OUT/p.txt" | cut -c1-160
  rm -rf "$OUT/p"
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
pack_triton_cache
