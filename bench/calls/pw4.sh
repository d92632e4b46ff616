# The fortieth run's H100 winners (tuned.TUNED_CU_CARD["H100"]: q5 on prepared words at M = 1 and 4,
# gemv_mma for q4 gate+up at M = 4) in the 27B int4 MTP round and its plain step, one process, the
# model built with them (NINFER_CU_CARD=H100 in the process: the words are made at load), then
# alternated with the shared table alone (NINFER_Q5_WORDS=0 NINFER_CU_CARD=0: no words read, no
# card entries). On an H200 this times the H100's winners there too (~4-6 min cold, any card).
. bench/device_env.sh
t0=$(date +%s)
T=${PW4_T:-400}
timeout ${PW4_TEST:-100} python3 -m pytest -q -rf -m gpu tests/plugins/cuda_fast/test_folds_gpu.py -k q5_words > "$OUT/t.txt" 2>&1
echo "words model test rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)|^E  " "$OUT/t.txt" | head -8 | cut -c1-250
# the K-chunked tensor-core form (kc, new) against the rest on q5 down at M = 4, where 320 row groups
# left a third of the SMs a CTA short (information: the A/B below runs the card table as committed)
timeout ${PW4_BENCH:-70} python3 bench/cu_gemv_bench.py --out "$OUT" --ms 4 --shapes q5_g64:5120x17408 > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A3 "^best" "$OUT/b.txt" | cut -c1-170
grep -E "kc[24]" "$OUT/b.txt" | head -28 | cut -c1-100
NINFER_CU_CARD=H100 timeout $(( T - ($(date +%s) - t0) )) python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short \
  --budget-s $(( T - ($(date +%s) - t0) - 40 )) --variants "NINFER_Q5_WORDS=0 NINFER_CU_CARD=0|X=1|NINFER_Q5_WORDS=0 NINFER_CU_CARD=0|X=1" \
  > "$OUT/m27.txt" 2>&1
echo "27B round A/B rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^int4|spec round|^skipped|^copy|ERROR|Error" "$OUT/m27.txt" | cut -c1-250
grep -E "peak memory" "$OUT/m27.txt" | head -2
