# The thirty-ninth session's first call (~9 min, any card): the CUDA GEMV's pipelined walk (pf) and
# q5's prepared high-bit words (NINFER_Q5_WORDS), both written this session without a GPU:
# 1. the library built once (nvcc, ~30 s), then the CUDA GEMV's GPU tests (every config against the
#    reference; pf bit-equal to its plain config, words bit-equal to the runs of qhigh);
# 2. cu_gemv_bench over q4 gate+up and the 27B's four q5 shapes at M = 1 and 4, each config on qhigh
#    and on words -> $OUT/tuned_cu.py (plain winners, pf included), tuned_cu_words.py (q5 on words);
# 3. the two tables merged (words over plain) into $OUT/tuned_all.py for the step A/B (pw2.sh).
. bench/device_env.sh
t0=$(date +%s)
python3 -c "import torch; from ninfer_plugins.quant_int import gemv_cu as CU; CU.library(torch.device('cuda'))" \
  > "$OUT/build.txt" 2>&1
echo "library rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/build.txt" | cut -c1-300
timeout ${PW1_TEST:-200} python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_cu.py > "$OUT/t.txt" 2>&1
echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
grep -E "^E  " "$OUT/t.txt" | head -10 | cut -c1-250
S="q5_g64:5120x17408,q5_g64:16384x5120,q4_g64:34816x5120,q5_g64:5120x6144,q5_g64:13312x5120"
left=$(( ${PW1_T:-540} - ($(date +%s) - t0) ))
timeout $left python3 bench/cu_gemv_bench.py --out "$OUT" --ms 1,4 --budget-s $(( left - 40 )) --shapes $S > "$OUT/b.txt" 2>&1
echo "cu_gemv_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A24 "^best" "$OUT/b.txt" | cut -c1-170; grep -E "Error|error:|DIFFERS" "$OUT/b.txt" | head -5
python3 bench/join_tables.py "$OUT"
find "$OUT" -maxdepth 1 -name '*.json' ! -name cu_gemv_bench.json -delete
