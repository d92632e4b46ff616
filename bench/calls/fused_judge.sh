# Seventh session: GPU tests of the fused sampler and judge, then the MTP round with both
. "$(dirname "$0")/../device_env.sh"
timeout 170 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_sample.py tests/plugins/spec_mtp/test_spec_gpu.py tests/core/test_graphs.py > $OUT/t.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/t.txt; grep -E "^(FAILED|ERROR)" $OUT/t.txt | head
timeout 170 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > $OUT/mtp.txt 2>&1; echo "27B + MTP round rc=$?"; tail -4 $OUT/mtp.txt
