. bench/device_env.sh
t0=$(date +%s)
steps qwen3.6-27b 200 160 kt.txt "27B int4 step" "X=1" "NINFER_KW_TRY=1" "X=1" "NINFER_KW_TRY=1"
NINFER_PDL=0 timeout 300 python3 bench/graph_kernels.py --out "$OUT" > "$OUT/gk.txt" 2>&1
echo "graph_kernels rc=$? $(( $(date +%s) - t0 )) s"; head -c 9000 "$OUT/gk.txt" | cut -c1-150
pack_triton_cache
