# Seventh session's last device call: the fused sampler (chunks of 4096) and judge on the GPU, in the rounds
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_1 .whl/*.whl && export PYTHONPATH=/tmp/site_1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
timeout 140 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_sample.py tests/plugins/spec_mtp/test_spec_gpu.py > $OUT/t.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/t.txt; grep -E "^(FAILED|ERROR)" $OUT/t.txt | head
