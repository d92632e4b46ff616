python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_1 .whl/*.whl && export PYTHONPATH=/tmp/site_1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
timeout 190 python3 -m pytest -q -rf -m gpu -n 4 tests/core/test_graphs.py tests/plugins/cuda_fast/test_folds_gpu.py tests/plugins/quant_int/test_gemv_h2.py tests/plugins/qwen_hybrid/test_gpu.py > $OUT/t.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/t.txt; grep -E "^(FAILED|ERROR)" $OUT/t.txt | head
for m in qwen3.6-27b qwen3.6-35b-a3b; do timeout 90 ninfer bench --model $m --random-weights --quant int4 --prompt-len 8192 --gen-len 64 --json $OUT/b_$m.json > $OUT/b_$m.txt 2>&1; echo "$m rc=$?"; grep -E "switches|decode|roofline" $OUT/b_$m.txt; done
timeout 200 python3 bench/h2_tune.py --out $OUT --budget-s 170 --pairs "q8_g32:27b.mtp.qkv_merged,q8_g32:27b.mtp.fc,q4_g64:27b.shortlist_head,q8_g32:27b.gate_up_merged,q8_g32:27b.down_proj,q8_g32:27b.o_proj|out_proj" > $OUT/tune.txt 2>&1; echo "tune rc=$?"; tail -22 $OUT/tune.txt
