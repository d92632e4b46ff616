# The 27B MTP round after the drafter's tuned shapes, and the fold test after the defaults changed.
. "$(dirname "$0")/../device_env.sh"
timeout 150 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > $OUT/mtp.txt 2>&1; echo "mtp rc=$?"; tail -3 $OUT/mtp.txt
timeout 120 python3 -m pytest -q -rf -m gpu -n 2 tests/plugins/cuda_fast/test_folds_gpu.py > $OUT/t.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/t.txt
