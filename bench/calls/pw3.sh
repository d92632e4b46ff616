# pw1 + pw2 in one call (~9.5 min, any card), for a session with one call's device time left:
# 1. the library built (nvcc), then the GPU tests of the pipelined walk, q5 words and ofs (bit-equal /
#    within a bf16 rounding of their plain configs, every config against the reference);
# 2. cu_gemv_bench on q5 down, q5 qkv+z and q4 gate+up at M = 1 and 4 -> tables, merged (words over plain);
# 3. the 27B int4 step: as committed against the tables with q5 on words, alternated, in the time left.
. bench/device_env.sh
t0=$(date +%s)
T=${PW3_T:-570}
python3 -c "import torch; from ninfer_plugins.quant_int import gemv_cu as CU; CU.library(torch.device('cuda'))" \
  > "$OUT/build.txt" 2>&1
echo "library rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/build.txt" | cut -c1-300
timeout ${PW3_TEST:-110} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py \
  -k "pipelined or (every_config and (5120-17408 or 300-640 or 77-1152))" > "$OUT/t.txt" 2>&1
echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
grep -E "^E  " "$OUT/t.txt" | head -8 | cut -c1-250
S="q5_g64:5120x17408,q5_g64:16384x5120,q4_g64:34816x5120"
timeout ${PW3_BENCH:-170} python3 bench/cu_gemv_bench.py --out "$OUT" --ms 1,4 --budget-s $(( ${PW3_BENCH:-170} - 50 )) --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A12 "^best" "$OUT/b.txt" | cut -c1-170; grep -E "Error|error:|DIFFERS" "$OUT/b.txt" | head -5
python3 bench/join_tables.py "$OUT"
A=$(realpath "$OUT/tuned_all.py")
left=$(( T - ($(date +%s) - t0) ))
if [ $left -gt 100 ]; then
  NINFER_Q5_WORDS=1 NINFER_CU_TUNED=$A timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k \
    --budget-s $(( left - 20 )) --variants "NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0|X=1|NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0|X=1" \
    > "$OUT/s27.txt" 2>&1
  echo "27B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|^copy|ERROR|Error" "$OUT/s27.txt" | cut -c1-170
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name cu_gemv_bench.json ! -name dense_27b.json -delete
