# A short call (~150 s of device time after the start; forty-first session, with ~420 s of budget
# left after eight failed starts): the CUDA GEMV's ranking on q5 only, plain against prepared words.
# On an H200 the open question is whether the words lift q5 off its 63% of copy (issue-bound
# there, thirty-ninth run): q5 down and q5 qkv+z at M = 1 and 4. Elsewhere the K-chunked
# tensor-core form (kc, never run) on q5 down at M = 4.
. bench/device_env.sh
T=${PW6_T:-130}
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$GPU_NAME" in
  *H200*) S="q5_g64:5120x17408,q5_g64:16384x5120"; MS=1,4 ;;
  *) S="q5_g64:5120x17408"; MS=4 ;;
esac
timeout $T python3 bench/cu_gemv_bench.py --out "$OUT" --ms $MS --budget-s $(( T - 25 )) --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$?"; grep -A12 "^best" "$OUT/b.txt" | cut -c1-170; grep -E "Error|error:|DIFFERS" "$OUT/b.txt" | head -5
grep -E "kc[24]" "$OUT/b.txt" | head -20 | cut -c1-100
