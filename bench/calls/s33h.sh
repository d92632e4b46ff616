# Thirty-third session's short call for whichever card comes (~7 min warm): the GPU tests of the
# paths the thirty-second session changed without a GPU (the subnormal decode's removal from the
# int GEMVs and the MoE pair, the MTP layer merged, the one-token bf16 GEMV), then the 27B MTP round
# merged against NINFER_MTP_FUSE=0, alternated; the Triton cache last. S33_TESTS=0: the round alone
# (s33.sh, after the bf16 GEMV's own tests).
. bench/device_env.sh
t0=$(date +%s)
if [ "${S33_TESTS:-1}" != 0 ]; then
  timeout ${S33_T:-220} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/spec_mtp tests/plugins/cuda_fast/test_dense_gemv.py \
    tests/plugins/quant_int/test_gemv_h2.py tests/plugins/quant_int/test_gemv_kw.py tests/plugins/moe_triton/test_moe_pairs.py \
    > "$OUT/t.txt" 2>&1
  echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
fi
t0=$(date +%s)
timeout ${S33_M:-200} python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( ${S33_M:-200} - 70 )) \
  --variants "X=1|NINFER_MTP_FUSE=0|X=1|NINFER_MTP_FUSE=0" > "$OUT/m.txt" 2>&1
echo "MTP rounds rc=$? $(( $(date +%s) - t0 )) s"
grep -E "spec round|^skipped|ERROR|Error" "$OUT/m.txt" | cut -c1-160
pack_triton_cache
