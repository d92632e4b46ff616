# The chunked GDN verify (NINFER_GDN_CHUNK=1, `_gdn_columns_chunk_kernel`, written in the
# thirty-fifth session without a GPU; interpreter-tested, compiled for sm_90: 255 registers, 40 B
# spilled at BV 32): its GPU tests, bench/gdn_columns.py against the token-by-token replay form,
# the MTP GPU tests under it, then the 27B MTP round alternated with it off (~6 min on any card)
. bench/device_env.sh
t0=$(date +%s)
timeout ${S35C_T:-150} python3 -m pytest -q -rf -m gpu -n $NW tests/core/kernels/test_triton_gdn.py -k "chunked or replay" \
  > "$OUT/t.txt" 2>&1
echo "GDN GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
timeout 120 python3 bench/gdn_columns.py --variants 32:4:pr,32:4:prc,32:8:prc,64:4:prc,64:8:prc,128:4:prc,128:8:prc,16:2:prc \
  --decode-variants 128:4:p > "$OUT/gc.txt" 2>&1
echo "gdn_columns rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-150 "$OUT/gc.txt"
NINFER_GDN_CHUNK=1 timeout 150 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/spec_mtp/test_spec_gpu.py \
  > "$OUT/t2.txt" 2>&1
echo "MTP GPU tests (chunked) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t2.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t2.txt" | head
cat "$OUT/t2.txt" >> "$OUT/t.txt" && rm -f "$OUT/t2.txt"
left=$(( ${S35C_S:-560} - ($(date +%s) - t0) ))
timeout $left python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $(( left - 60 )) \
  --variants "X=1|NINFER_GDN_CHUNK=1|X=1|NINFER_GDN_CHUNK=1" > "$OUT/m.txt" 2>&1
echo "MTP rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-150
# a call brings back 8 files: dense_27b.json holds every run's figures, so the per-run copies go
# (the Triton cache then comes back too)
find "$OUT" -maxdepth 1 -name '*.json' ! -name dense_27b.json -delete
