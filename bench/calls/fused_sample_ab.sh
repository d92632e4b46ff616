# Seventh session: the fused sampler against the reference pipeline, both models, one process each
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_1 .whl/*.whl && export PYTHONPATH=/tmp/site_1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
for m in qwen3.6-35b-a3b qwen3.6-27b; do
  B="ninfer bench --model $m --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
  timeout 130 $B --json $OUT/b_$m.json > $OUT/b_$m.txt 2>&1; echo "$m fused sampler rc=$?"; grep -E "decode|roofline" $OUT/b_$m.txt
  NINFER_FUSED_SAMPLE=0 timeout 110 $B --json $OUT/b_${m}_ref.json > $OUT/b_${m}_ref.txt 2>&1; echo "$m reference sampler rc=$?"; grep -E "decode|roofline" $OUT/b_${m}_ref.txt
done
