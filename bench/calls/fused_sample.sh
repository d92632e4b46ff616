# Seventh session: the fused sampler on the GPU (tests, then the A/B on both models, then the MTP round)
. "$(dirname "$0")/../device_env.sh"
timeout 170 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_sample.py tests/core/test_graphs.py tests/plugins/spec_mtp/test_spec_gpu.py > $OUT/t.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/t.txt; grep -E "^(FAILED|ERROR)" $OUT/t.txt | head
B="ninfer bench --model qwen3.6-35b-a3b --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
timeout 90 $B --json $OUT/b35.json > $OUT/b35.txt 2>&1; echo "35B fused sampler rc=$?"; grep -E "decode|roofline" $OUT/b35.txt
NINFER_FUSED_SAMPLE=0 timeout 90 $B --json $OUT/b35_ref.json > $OUT/b35_ref.txt 2>&1; echo "35B reference sampler rc=$?"; grep -E "decode|roofline" $OUT/b35_ref.txt
timeout 170 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > $OUT/mtp.txt 2>&1; echo "27B + MTP round rc=$?"; tail -4 $OUT/mtp.txt
