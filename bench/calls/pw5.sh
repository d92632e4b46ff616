# On an H200 (~8-9 min; the CUDA GEMV library from .tcache, bench/prebuild_cu.py): the CUDA GEMV's
# winners there on q5's prepared words and the plain configs, then the 27B int4 MTP round (and its
# plain step) with them against the shared table alone:
# 1. cu_gemv_bench on q5 down, q5 qkv+z and q4 gate+up at M = 1 and 4 -> $OUT/tuned_cu.py (plain) and
#    tuned_cu_words.py (keyed 21, gemv_cu.Q5_WORDS), joined into tuned_all.py;
# 2. the words' model test (every launch on the CUDA GEMV, words against the runs of qhigh: same bits);
# 3. dense_27b int4_8k_mtp3_short built with tuned_all (its words made at load), alternated with
#    NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0 (no words, the shared table).
. bench/device_env.sh
t0=$(date +%s)
T=${PW5_T:-540}
S="q5_g64:5120x17408,q5_g64:16384x5120,q4_g64:34816x5120"
timeout ${PW5_BENCH:-170} python3 bench/cu_gemv_bench.py --out "$OUT" --ms 1,4 --budget-s $(( ${PW5_BENCH:-170} - 40 )) --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A12 "^best" "$OUT/b.txt" | cut -c1-170; grep -E "Error|error:|DIFFERS" "$OUT/b.txt" | head -5
python3 bench/join_tables.py "$OUT"
rm -f "$OUT/tuned_cu.py" "$OUT/tuned_cu_words.py"  # in b.txt and tuned_all.py (a call brings back 8 files)
timeout ${PW5_TEST:-100} python3 -m pytest -q -rf -m gpu tests/plugins/cuda_fast/test_folds_gpu.py -k q5_words > "$OUT/t.txt" 2>&1
echo "words model test rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)|^E  " "$OUT/t.txt" | head -8 | cut -c1-250
A=$(realpath "$OUT/tuned_all.py")
left=$(( T - ($(date +%s) - t0) ))
if [ -f "$A" ] && [ $left -gt 120 ]; then
  NINFER_CU_TUNED=$A timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 20 )) \
    --variants "NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0|X=1|NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0|X=1" \
    > "$OUT/m27.txt" 2>&1
  echo "27B round A/B rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "^int4|spec round|^skipped|^copy|ERROR|Error" "$OUT/m27.txt" | cut -c1-250
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name cu_gemv_bench.json ! -name dense_27b.json -delete
