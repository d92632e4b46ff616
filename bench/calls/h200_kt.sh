# The thirty-fourth run's call: the 27B int4 step with and without TUNED_KW_TRY (q5 down in 4 K shares),
# alternated in one process, then the H200's plain step and MTP round by kernel (PDL off).
. bench/device_env.sh
t0=$(date +%s)
timeout 230 python3 bench/dense_27b.py --skip-tests --model qwen3.6-27b --only int4_8k --budget-s 200 \
  --variants "X=1|NINFER_KW_TRY=1|X=1|NINFER_KW_TRY=1" > "$OUT/kt.txt" 2>&1
echo "27B int4 step rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4_8k|^skipped|ERROR" "$OUT/kt.txt" | cut -c1-150
NINFER_PDL=0 timeout 300 python3 bench/graph_kernels.py --out "$OUT" > "$OUT/gk.txt" 2>&1
echo "graph_kernels rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^==|us/call" "$OUT/gk.txt" | cut -c1-150
pack_triton_cache
