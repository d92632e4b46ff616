# The 27B MTP round after the drafter's tuned shapes, and the fold test after the defaults changed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_1 .whl/*.whl && export PYTHONPATH=/tmp/site_1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
timeout 150 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > $OUT/mtp.txt 2>&1; echo "mtp rc=$?"; tail -3 $OUT/mtp.txt
timeout 120 python3 -m pytest -q -rf -m gpu -n 2 tests/plugins/cuda_fast/test_folds_gpu.py > $OUT/t.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/t.txt
