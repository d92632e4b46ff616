# Seventh session: the fused sampler against the reference pipeline, both models, one process each
. "$(dirname "$0")/../device_env.sh"
for m in qwen3.6-35b-a3b qwen3.6-27b; do
  B="ninfer bench --model $m --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
  timeout 130 $B --json $OUT/b_$m.json > $OUT/b_$m.txt 2>&1; echo "$m fused sampler rc=$?"; grep -E "decode|roofline" $OUT/b_$m.txt
  NINFER_FUSED_SAMPLE=0 timeout 110 $B --json $OUT/b_${m}_ref.json > $OUT/b_${m}_ref.txt 2>&1; echo "$m reference sampler rc=$?"; grep -E "decode|roofline" $OUT/b_${m}_ref.txt
done
