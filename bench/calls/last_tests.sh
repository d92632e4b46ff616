# Seventh session's last device call: the fused sampler (chunks of 4096) and judge on the GPU, in the rounds
. "$(dirname "$0")/../device_env.sh"
timeout 140 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_sample.py tests/plugins/spec_mtp/test_spec_gpu.py > $OUT/t.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/t.txt; grep -E "^(FAILED|ERROR)" $OUT/t.txt | head
