# Thirty-fifth session, last call (~7 min, any card): the bars' runs with every default (the bf16
# GEMV now the default; the bf16 27B fits an 80 GiB card since the plan credits a reused model's
# memory), for the table's H100 column when an H100 comes: 27B bf16 / int4 / nvfp4 at 8K, int4 at
# 131K with the INT8 cache, the MTP round (shortlist head), then the 35B-A3B int4 step and round
. bench/device_env.sh
t0=$(date +%s)
S27=${S35B_27:-250}
timeout $S27 python3 bench/dense_27b.py --skip-tests --only bf16_8k_alone,int4_8k,nvfp4_8k,int4_131k_int8kv,int4_8k_mtp3_short \
  --budget-s $(( S27 - 30 )) > "$OUT/b27.txt" 2>&1
echo "27B rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^(int4|nvfp4|bf16)|spec round|^skipped|ERROR" "$OUT/b27.txt" | cut -c1-150
left=$(( ${S35B_S:-420} - ($(date +%s) - t0) ))
timeout $left python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k,int4_8k_mtp3_short \
  --budget-s $(( left - 50 )) > "$OUT/b35.txt" 2>&1
echo "35B rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^int4|spec round|^skipped|ERROR" "$OUT/b35.txt" | cut -c1-150
# a call brings back 8 files: dense_27b.json holds every run's figures, so the per-run copies go
# (the Triton cache then comes back too)
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
