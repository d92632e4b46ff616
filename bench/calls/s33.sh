# Thirty-third session's first H200 call (~9.5 min warm): the one-token bf16 GEMV (GPU tests,
# microbench, the 27B bf16 step alternated; bench/calls/dense_gemv.sh), then the 27B MTP round with
# the MTP layer's projections merged against NINFER_MTP_FUSE=0, alternated; the Triton cache last.
DG_S=${DG_S:-300} bash bench/calls/dense_gemv.sh
. bench/device_env.sh > /dev/null
t0=$(date +%s)
timeout ${S33_M:-230} python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( ${S33_M:-230} - 70 )) \
  --variants "X=1|NINFER_MTP_FUSE=0|X=1|NINFER_MTP_FUSE=0" > "$OUT/m.txt" 2>&1
echo "MTP rounds rc=$? $(( $(date +%s) - t0 )) s"
grep -E "spec round|^skipped|ERROR|Error" "$OUT/m.txt" | cut -c1-160
pack_triton_cache
