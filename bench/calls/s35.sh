# Thirty-fifth session, second H100 call (~9 min): the bf16 head through the one-token GEMV against
# cuBLAS, the q6 head at M = 4 (kw_bench), then the GPU tests with NINFER_DENSE_GEMV=all the default
# (every bf16 GPU path at one token now takes it): tests-b's set and the model GPU tests; the Triton
# cache last
. bench/device_env.sh
t0=$(date +%s)
timeout 60 python3 bench/dense_gemv_bench.py --budget-s 45 --shapes 248320x5120 > "$OUT/db.txt" 2>&1
echo "head bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^    BN" "$OUT/db.txt" | cut -c1-150; grep -E "^    BN" "$OUT/db.txt" | cut -c1-100
timeout 90 python3 bench/kw_bench.py --out "$OUT" --ms 4 --shapes q6_g64:248320x5120 > "$OUT/kw.txt" 2>&1
echo "kw_bench rc=$? $(( $(date +%s) - t0 )) s"; tail -15 "$OUT/kw.txt" | cut -c1-160
left=$(( ${S35_S:-520} - ($(date +%s) - t0) ))
timeout $left python3 -m pytest -q -rf -m gpu -n $NW tests/core/test_graphs.py tests/plugins/cuda_fast tests/core/kernels \
  tests/plugins/spec_mtp tests/plugins/qwen_hybrid/test_gpu.py tests/core/test_sampling.py > "$OUT/t.txt" 2>&1
echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
pack_triton_cache
