# The second call (~9 min warm, any card; pw1.sh's tables in bench/ as tuned_cu.py / tuned_all.py):
# the 27B int4 plain step, weights built once with NINFER_Q5_WORDS=1, alternated:
#   base  = as committed (no words at launch, TUNED_CU alone),
#   plain = pw1's plain winners (pf included) over TUNED_CU, no words,
#   words = the merged table, q5 on words;
# then the MTP round (verify at M = 4) base against words in the time left.
. bench/device_env.sh
t0=$(date +%s)
P=$(realpath bench/tuned_cu.py); A=$(realpath bench/tuned_all.py)
V="NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0|NINFER_Q5_WORDS=0 NINFER_CU_TUNED=$P NINFER_CU_CARD=0|X=1|NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0|X=1"
NINFER_Q5_WORDS=1 NINFER_CU_TUNED=$A timeout 330 python3 bench/dense_27b.py --skip-tests --only int4_8k --budget-s 300 \
  --variants "$V" > "$OUT/s27.txt" 2>&1
echo "27B int4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|^skipped|^copy|ERROR|Error" "$OUT/s27.txt" | cut -c1-170
left=$(( ${PW2_T:-560} - ($(date +%s) - t0) ))
if [ $left -gt 90 ]; then
  NINFER_Q5_WORDS=1 NINFER_CU_TUNED=$A timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short \
    --budget-s $(( left - 15 )) --variants "NINFER_Q5_WORDS=0 NINFER_CU_TUNED= NINFER_CU_CARD=0|X=1" > "$OUT/m.txt" 2>&1
  echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^int4|^skipped|ERROR" "$OUT/m.txt" | cut -c1-170
fi
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
