# Thirty-sixth session, third call (~8 min, any card): the CUDA GEMV after two fixes. (a) Launched
# inside launch.late_dependents() (the GDN decode step's projection) it now triggers its
# dependents after its PDL wait, as every kernel there must: its early trigger let the GDN step
# read the recurrent state while the round's commit could still be writing it (captured and eager
# rounds disagreed under NINFER_CU_GEMV=4). (b) NVFP4 winners in tuned.TUNED_CU.
# 1. the CUDA GEMV's GPU tests and the captured-round tests under NINFER_CU_GEMV=4;
# 2. the 27B nvfp4 step's profile (which kernels run: the step gained 0.15 ms of an expected ~1);
# 3. the 27B int4 MTP round and plain step, default against NINFER_CU_GEMV=0;
# 4. the 27B nvfp4 step, default against NINFER_CU_GEMV=0
. bench/device_env.sh
t0=$(date +%s)
T=${CU6_T:-470}
NINFER_CU_GEMV=4 timeout ${CU6_TEST:-170} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py \
  tests/plugins/spec_mtp/test_spec_gpu.py -k "captured or gemv_cu" > "$OUT/t.txt" 2>&1
echo "GPU tests (NINFER_CU_GEMV=4) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
timeout 110 python3 bench/profile_step.py --graph --model qwen3.6-27b --quant nvfp4 --gen-len 16 --rows 40 --out "$OUT/p" > "$OUT/p.txt" 2>&1
echo "profile rc=$? $(( $(date +%s) - t0 )) s"; head -48 "$OUT/p.txt" | cut -c1-160
rm -rf "$OUT/p"
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 100 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 20 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 70 ]; then
  timeout $left python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s $(( left - 15 )) \
    --variants "X=1|NINFER_CU_GEMV=0" > "$OUT/s.txt" 2>&1
  echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/s.txt" | cut -c1-150
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
pack_triton_cache
