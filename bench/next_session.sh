#!/bin/bash
# The first device calls BENCHMARKS.md's "Next session" list asks for, one per argument:
#
#   bash bench/next_session.sh tests   # GPU tests (~8-9 min cold; or tests-a then tests-b, ~5 min each)
#   bash bench/next_session.sh folds   # 35B ninfer bench: int4 default, +lookahead, gates apart; nvfp4 +-lookahead (~5 min)
#   bash bench/next_session.sh dense   # 27B int4: default, GEMV_GATED=1, LOOKAHEAD=1, GDN_AB=0; the MTP round (~5 min)
#   bash bench/next_session.sh profile # 27B step profiles, gates in the GDN step and apart, and the MTP round
#   bash bench/next_session.sh tune    # the MTP drafter's q8 shapes and the shortlist head through h2_tune (~5 min)
#   bash bench/next_session.sh round   # the MTP round, gates in the verify launch and apart; the 35B step's profile (~8 min)
#   bash bench/next_session.sh kernels # 35B MoE per-layer timings (add+norm against route_gemv+add+norm)
#   bash bench/next_session.sh ahead   # speculative rounds launched ahead (the default since the ninth session)
#                                      # against NINFER_SPEC_AHEAD=0: GPU tests, the 27B MTP round each way (~5 min)
#   bash bench/next_session.sh tcd     # 27B plain step with every q4/q5 launch on the direct tensor-core GEMV
#                                      # (NINFER_TCD=1) and without: ninfer bench and the graph profile of each
#   bash bench/next_session.sh late    # the direct kernel's late PDL trigger (NINFER_TC_LATE=1): its GPU test, the
#                                      # 27B plain step with every q4/q5 GEMV direct (NINFER_TCD=1) without and with it,
#                                      # and the MTP round without and with it; the split GDN verify's norm in its
#                                      # launch (NINFER_GDN_SPLIT_NORM=1): bench/gdn_columns.py and the round (~7 min)
#   bash bench/next_session.sh first   # the tenth session's first call: GPU tests of what changed without a GPU
#                                      # (gemv_tc's slice sum and late trigger, the split GDN norm, the MTP alignment
#                                      # on seed rows: test_gemv_tc, test_triton_gdn, test_spec_gpu), down at M = 4
#                                      # ranked again, the MTP round as is / NINFER_TC_LATE=1 / NINFER_GDN_SPLIT_NORM=1 /
#                                      # NINFER_MTP_SEED_ROWS=0 (the alignment's MLP over every column, as before)
#   bash bench/next_session.sh commit  # the next session's first call: GPU tests of the commit kernel, the forced
#                                      # verify split, the round's bookkeeping kernels and the sampler's new keywords,
#                                      # bench/commit_bench.py, the MTP round as committed / with the torch commit
#   bash bench/next_session.sh commit2 # the MTP round with the torch bookkeeping (NINFER_ROUND_IO=0) / as committed /
#                                      # BV 16 w2 / BV 16 w2 + conv inputs ahead
#   bash bench/next_session.sh tail [35b|27b]  # the plain step's tail in the sampler against NINFER_STEP_TAIL=0,
#                                      # alternated twice, one model a call
#   bash bench/next_session.sh ablate  # the f16x2 GEMV with and without its decode + FMAs (bench/h2_ablate.py), then
#                                      # the read ceiling with the tile walk on every shape (~6 min)
#   bash bench/next_session.sh ceiling # read-only kernels over the 27B's big q4/q5 matrices: a flat stream and the
#                                      # f16x2 GEMV's tile walk, no decode (bench/read_ceiling.py, ~2 min)
#   bash bench/next_session.sh next1   # on an H200: tkw_bench's ring set, the round grouped / not, the 27B and 35B steps
#   bash bench/next_session.sh early   # reads before the PDL wait (NINFER_GDN_EARLY, NINFER_MOE_EARLY) and the K-walk's
#                                      # x pairs from the norms (NINFER_KW_XREUSE), written without a GPU: their GPU
#                                      # tests and the 35B step with and without (~9.5 min); early2: the 27B step and
#                                      # the MTP round with and without (~9.5 min)
#   bash bench/next_session.sh mtp35   # the 35B-A3B MTP round (never measured) and its projection beside the plain step
#   bash bench/next_session.sh bars    # on an H200: the issues' bar figures with every default (27B int4/nvfp4/bf16,
#                                      # 131K INT8 KV, the MTP round; the 35B step and round; ~9.5 min)
#   bash bench/next_session.sh int8    # the 27B int8 step: the drafter's q8 K-walk entries against NINFER_KW=0 (~4 min)
#   bash bench/next_session.sh p35     # the 35B-A3B step and MTP round by kernel (~7 min)
#   bash bench/next_session.sh gates   # the GDN gates before the PDL wait (NINFER_GDN_GATES_EARLY=1): GPU tests, the 27B
#                                      # plain step and MTP round alternated (~4 min warm; cold: GATES_S=560)
#   bash bench/next_session.sh moe5    # the 35B step and round: GATES_EARLY, the route kernel's shared gate unrolled, pair
#                                      # down's one-load combine, each against its switch (~7 min warm; cold: MOE5_S=590)
#   bash bench/next_session.sh split   # split kernels' release arrivals against NINFER_SPLIT_ACQ_REL=1: GPU tests, then
#                                      # the 35B step and round (SPLIT_M=qwen3.6-27b for the 27B), a process a side
#   bash bench/next_session.sh onek    # gate_up in one K slice (no counter), down in smaller chunks: GPU tests, the
#                                      # pair sweep (NINFER_SWEEP_ONEK=1), the 35B step and round with the switches (~8 min)
#   bash bench/next_session.sh go7     # run 2026-12-06: one-slice gate_up and small-chunk down's GPU tests, then the 35B
#                                      # step and round with each (now the defaults) and NINFER_L2PF against as committed
#   bash bench/next_session.sh go8     # the new pair defaults (one-slice gate_up, 16-row down): every MoE GPU test, the 35B
#                                      # MTP and fused-path GPU tests, then the 35B step and round over neighbouring configs
#   bash bench/next_session.sh go9     # the 35B's grouped MoE prefill (never timed) against the tiles at 8K, then the
#                                      # round with the verify routed in route_gemv's one launch (NINFER_ROUTE_GEMV_T=4)
#   bash bench/next_session.sh auto    # whichever card comes: every GPU test (`tests`; AUTO_H200 / AUTO_OTHER to change)
#   bash bench/next_session.sh np2     # the 27B int4 step with NINFER_NORM_PAIRS against =0, its GPU tests, the 35B step
#   bash bench/next_session.sh pw1     # the CUDA GEMV's pipelined walk and q5 words: GPU tests, cu_gemv_bench -> tables (~9 min)
#   bash bench/next_session.sh pw2     # pw1's tables (copied to bench/) in the 27B int4 step and the MTP round (~9 min)
#   bash bench/next_session.sh pw3     # pw1 + pw2 in one call: fewer tests and shapes, the 27B step A/B (~9.5 min)
#   bash bench/next_session.sh pw4     # the H100 card table (q5 words, gemv_mma q4 at M = 4) in the 27B round and
#                                      # its plain step against the shared table alone, one process (~5 min)
#   bash bench/next_session.sh pw5     # on an H200: cu_gemv_bench (q5 words and plain) -> tables, the words' model
#                                      # test, the 27B round and plain step with the tables A/B (~9 min);
#                                      # `AUTO_H200=pw5 AUTO_OTHER=pw4 bash bench/next_session.sh auto` picks by card
#   bash bench/next_session.sh s33     # bench/calls/s33.sh: the bf16 GEMV's tests, bench and step A/B; the MTP merge A/B (~9 min)
#   bash bench/next_session.sh s33h    # bench/calls/s33h.sh: GPU tests of the 32nd session's changes; the MTP merge A/B (~7 min)
#   bash bench/next_session.sh kwnv    # kwdq then nvtile in one call (~8.5 min)
#   bash bench/next_session.sh nvf16   # the NVFP4 layout g16-split8-f16: every NVFP4 GPU test, the 27B nvfp4 step +-KW (~9.5 min)
#   bash bench/next_session.sh nvkwb   # kw_bench over the NVFP4 shapes of the 27B and 35B-A3B, M = 1 and 4 (~7 min)
#   bash bench/next_session.sh dqkw    # short: the NVFP4 dequant test + dq_bench, kw_bench on three NVFP4 shapes at M = 1 (~6 min)
#   bash bench/next_session.sh kwdq    # short: the new K-walk entries' and the dequant's GPU tests, the 27B nvfp4 step (~3 min)
#   bash bench/next_session.sh nvtile  # NVFP4 at M = 8..64 on the tile kernel, scales broadcast / gathered (~4 min)
#   bash bench/next_session.sh kwh200  # on an H200: kw_bench over the 27B's five big shapes, M = 1 and 4 (~6 min)
#   bash bench/next_session.sh busy    # streams' longest token gap while a 16K prompt prefills, by busy chunk (~4 min)
#   bash bench/next_session.sh nvkw    # the 27B nvfp4 step with its NVFP4 projections and q8 head on the K-walk (TUNED_KW_TRY), int8 too (~7 min)
#   bash bench/next_session.sh go11    # 32K prompts in chunks of 16,384 / 32,768: the 35B-A3B (grouped) and the 27B (~6 min)
#   bash bench/next_session.sh qbars   # issue 3's bar table on the dispatched kernels (bench/quant_bars.py): int4 (the
#                                      # recipe's scheme a shape) and nvfp4 at M = 1/4/8/16/1024, every 27B and 35B shape
#   bash bench/next_session.sh go10    # the grouped MoE prefill's default: GPU tests, 4,096-token chunks tiles/grouped,
#                                      # 16K prompts in chunks of 8,192 against 16,384 (35B both paths, 27B; ~5 min)
#   bash bench/next_session.sh chunks  # the 8K prefill at the CLI's default chunk (1024) against 2048 and 8192 (the
#                                      # bench's one chunk): the 27B, the 35B on the tiles and grouped (~7 min)
#   bash bench/next_session.sh kwncu35 # Nsight Compute over the 35B's big q8 decode GEMVs at M = 1 as dispatched (in_proj_qkvz,
#                                      # attention qkv, o_proj/out_proj): most of its step's weight bytes (~2 min)
#   bash bench/next_session.sh gdnbv35 # the 35B's GDN verify columns and decode step over BV:warps, the round (~4 min)
#   bash bench/next_session.sh gdnbv   # the GDN verify columns (replay form) and decode step over BV:warps (~3 min)
#   bash bench/next_session.sh gdnncu  # Nsight Compute over one GDN verify columns and one decode launch (~1 min)
#   bash bench/next_session.sh pairncu # Nsight Compute over the 35B MoE pair kernels at T = 1 and 4 (~2 min)
#   bash bench/next_session.sh ahead2  # the MTP GPU tests with eager rounds run ahead (passed on an H100, 31)
#   bash bench/next_session.sh probe   # where the medium int4 35B's batched captured MTP rounds part from eager
#                                      # (bench/probe_moe_spec2.py), then the MTP GPU tests under NINFER_GDN_REPLAY=1
#   bash bench/next_session.sh kwtry   # the 27B MTP round with the drafter's K-walk candidates (NINFER_KW_TRY=1)
#   bash bench/next_session.sh go3     # kw_bench (new shapes, ragged splits) + the 27B step with TUNED_KW (~9.5 min)
#   bash bench/next_session.sh go4     # the MTP round and 35B step with TUNED_KW, the grouped MoE prefill (~9.5 min)
#   bash bench/next_session.sh go5     # NINFER_L2PF: GEMVs behind an idle stand-in, the 27B and 35B steps (~9.5 min)
#   bash bench/next_session.sh tkw     # the tensor-core K-walk (gemv_tkw.py, written without a GPU): its GPU tests and
#                                      # gemv_tc's (refactored), tkw_bench at M = 1/4/8, the 27B step and MTP round
#                                      # with NINFER_TKW=1 against as committed (~9.5 min)
#   bash bench/next_session.sh tkw2    # a short call: tkw_bench on the three big shapes (PF 3-4 configs), the TKW GPU
#                                      # tests, the MTP round with TUNED_TKW against NINFER_TKW=0 (~4-8 min)
#   bash bench/next_session.sh pin     # the decode GEMVs' next-tile loads pinned ahead of the math (NINFER_PIN=1; written
#                                      # without a GPU): their GPU tests, the 27B and 35B steps against as committed (~9.5 min)
#   bash bench/next_session.sh ring    # the tensor-core K-walk's cp.async ring (written without a GPU): GPU tests,
#                                      # tkw_bench (ring configs), the MTP round with NINFER_TKW_RING=4 (~8 min)
#   bash bench/next_session.sh ring2   # next session's first: TKW GPU tests, tkw_bench --set ring on every shape, the
#                                      # round against NINFER_TKW_RING=0, bench/attn_sweep.py (~9.5 min)
#   bash bench/next_session.sh ring3   # every q4/q5 decode GEMV on the TKW ring (default configs, 3 stages) against
#                                      # as committed: the 27B step, then the MTP round (~7 min)
#   bash bench/next_session.sh go6     # profiles: the 27B and 35B steps and the MTP round, by kernel (~8 min)
#   bash bench/next_session.sh kw      # the K-walk GEMV (gemv_kw.py, written without a GPU): its GPU tests, then
#                                      # bench/kw_bench.py against the dispatched kernel, shape by shape (~7 min)
#   bash bench/next_session.sh kwstep [27b|35b|round]  # the decode step (or the 27B MTP round) as committed against
#                                      # NINFER_KW=1, alternated twice in one process (~5-8 min)
#   bash bench/next_session.sh block   # the decode MoE layer in one launch (moe_block.py, written without a GPU): its
#                                      # GPU tests, per-layer timings against the three launches, the 35B step (~8 min)
#   bash bench/next_session.sh prefill35 # the 35B MoE prefill as bf16-decoded experts + grouped GEMMs against the
#                                      # tile kernels (prefill_grouped.py, written without a GPU): tests, 8K A/B (~6 min)
#   bash bench/next_session.sh head4   # the q6 head (27B) and the q8 drafter shapes ranked at M = 4 over every
#                                      # f16x2 candidate (its M = 4 entry came from M = 1's best three; 255 registers)
#
# Run on the lent H200 from the repository root with `.whl` carried; everything lands in $OUT.
set -u
. "$(dirname "$0")/device_env.sh"

# the 27B MTP round (bench/dense_27b.py's short K = 3 case) under each environment given, in order,
# in ONE process (the weights built once; dense_27b.py --variants, which refuses switches not read
# per run): rounds SECONDS "ENV..." ... (an ENV of "X=1" is the tree as committed); needs t0.
# Variants that would start past SECONDS - 70 are skipped and named.
rounds() {
  local limit=$1 vs
  shift
  vs=$(printf '%s|' "$@")
  timeout "$limit" python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short --budget-s $((limit - 70)) \
    --variants "${vs%|}" > "$OUT/m.txt" 2>&1
  echo "MTP rounds rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "spec round|^skipped|ERROR" "$OUT/m.txt" | cut -c1-150
}

# the plain decode step (int4, 8K context) of MODEL under each environment given, in order, in ONE
# process (dense_27b.py --variants): steps MODEL SECONDS BUDGET FILE LABEL "ENV..." ...; variants that
# would start past BUDGET seconds are skipped and named; needs t0.
steps() {
  local model=$1 limit=$2 budget=$3 file=$4 label=$5 vs
  shift 5
  vs=$(printf '%s|' "$@")
  timeout "$limit" python3 bench/dense_27b.py --skip-tests --model "$model" --only int4_8k --budget-s "$budget" \
    --variants "${vs%|}" > "$OUT/$file" 2>&1
  echo "$label rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4_8k|^skipped|ERROR" "$OUT/$file" | cut -c1-150
}

# GPU tests, two workers: gpu_tests SECONDS PYTEST_ARGS...; prints the summary and failures; needs t0
gpu_tests() {
  local limit=$1
  shift
  timeout "$limit" python3 -m pytest -q -rf -m gpu -n 2 "$@" > "$OUT/t.txt" 2>&1
  echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
}

# the 35B-A3B's plain step and MTP round (shortlist head) under each variant of V ("ENV|ENV|..."),
# twice over, in one process, until SECONDS from t0: rounds35 SECONDS V
rounds35() {
  timeout $(( $1 - ($(date +%s) - t0) )) python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b \
    --only int4_8k_mtp3_short --budget-s $(( $1 - 40 - ($(date +%s) - t0) )) --variants "$2|$2" > "$OUT/r35.txt" 2>&1
  echo "35B rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|spec round|^skipped|ERROR" "$OUT/r35.txt" | cut -c1-150
}

# the nineteenth session's GPU tests (reads before the PDL wait, the K-walk's x from the norms), -v
# -rfP so each is named and the ordering test's control count is printed: early_tests SECONDS; needs t0
early_tests() {
  timeout "$1" python3 -m pytest -v -rfP -m "gpu or not gpu" -n $NW tests/core/kernels/test_triton_pdl.py \
    "tests/plugins/moe_triton/test_moe_pairs.py::test_gpu_pairs_replay_in_a_cuda_graph" \
    "tests/core/kernels/test_triton_gdn.py::test_real_shapes_state_early_gpu" \
    "tests/plugins/cuda_fast/test_fused_path.py::test_state_read_before_the_wait_changes_no_bit" \
    "tests/plugins/cuda_fast/test_folds_gpu.py::test_gpu_early_loads_change_no_bit_and_keep_graph_equal_eager" \
    "tests/plugins/cuda_fast/test_folds_gpu.py::test_gpu_pairs_from_the_norm_change_no_bit" \
    "tests/plugins/quant_int/test_gemv_kw.py::test_norm_pairs_is_rmsnorm_then_xpairs" \
    "tests/plugins/quant_int/test_gemv_tkw.py::test_norm_xq_is_rmsnorm_then_xq" \
    "tests/plugins/quant_int/test_gemv_tkw.py::test_gpu_tkw_takes_x_prepared_by_the_norm" \
    "tests/core/kernels/test_triton_gdn.py::test_verify_columns_real_shapes_gpu" \
    "tests/plugins/moe_triton/test_moe_router.py::test_gpu_route_gemv_with_the_residual_add_and_norm" \
    "tests/plugins/moe_triton/test_moe_router.py::test_gpu_route_gemv_key_top_k_real_shapes" \
    "tests/plugins/quant_int/test_gemv_kw.py::test_gpu_35b_kw_entries_match_the_reference" \
    > "$OUT/t.txt" 2>&1
  echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(grep -c PASSED "$OUT/t.txt") passed"
  grep -E "FAILED|ERROR|^control" "$OUT/t.txt" | cut -c1-200 | head -20
}

# kwdq and nvtile as functions, so kwnv (auto's call on a card not an H200) runs both in one call
nvtile_run() {
    # NVFP4 at M = 8..64 on the fused tile kernel (2.2x q4's time at M = 8-16 on an H100): its block
    # scales broadcast (as committed) against gathered per column (NINFER_NV_SG=1), the NVFP4 GPU
    # kernel tests under the switch first (~4 min)
    t0=$(date +%s)
    NINFER_NV_SG=1 timeout 120 python3 -m pytest -q -rf -m gpu tests/plugins/quant_nvfp4/test_nvfp4_kernels.py > "$OUT/t.txt" 2>&1
    echo "NV_SG GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"
    timeout 200 python3 bench/dq_bench.py --tile \
      --shapes nvfp4:34816x5120,q4_g64:34816x5120,nvfp4:5120x17408,nvfp4:16384x5120 > "$OUT/nt.txt" 2>&1
    echo "dq_bench --tile rc=$? $(( $(date +%s) - t0 )) s"
    cut -c1-200 "$OUT/nt.txt"
}
kwdq_run() {
    # a short call (~3 min): the K-walk table's GPU tests (the new NVFP4 down / qkv+z entries) and the
    # NVFP4 dequant's, then the 27B nvfp4 step with every default (the joined dequant store: prefill)
    t0=$(date +%s)
    timeout ${KWDQ_T:-100} python3 -m pytest -q -rf -m gpu -n 2 tests/plugins/quant_int/test_gemv_kw.py \
      tests/plugins/quant_int/test_dequant.py -k "tuned_table or 35b_kw_entries or (every_code and nvfp4)" > "$OUT/t.txt" 2>&1
    echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    left=$(( ${KWDQ_S:-200} - ($(date +%s) - t0) ))
    timeout $left python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s $(( left - 20 )) > "$OUT/nv.txt" 2>&1
    echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|prefill|decode  |ERROR" "$OUT/nv.txt" | cut -c1-150
}

# auto: a call that takes whichever card comes (twenty-sixth session: two hours of refused
# starts; thirty-third, thirty-fifth to thirty-eighth: few machines): every GPU test with the
# thirty-eighth session's defaults (the pairs from the norms and the GDN step, the H200's NVFP4
# entries, rmsnorm_row's slice) on any card. `AUTO_H200=s35b` / `AUTO_OTHER=cu13` for other choices
if [ "${1:-}" = auto ]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "device: $GPU_NAME"
  case "$GPU_NAME" in
    *H200*) set -- ${AUTO_H200:-tests} ;;
    *) set -- ${AUTO_OTHER:-tests} ;;
  esac
fi

case "${1:-}" in
  s33|s33h|s35|s35b|s35c|cu3|cu4|cu5|cu6|cu7|cu8|cu9|cu10|cu11|cu12|cu13|np1|np2|pw1|pw2|pw3|pw4|pw5|pw6)
    # the call scripts set themselves up again (quick) and leave the Triton cache to the end here
    TCACHE_PACK=0 bash "bench/calls/$1.sh"
    ;;
  tests|tests-a|tests-b)
    # everything in one call (a cold machine needs more than the 600 s a call may take: 391 of ~430
    # in 495 s on 2026-12-04), or in two calls: tests-a (quant_int, moe_triton), tests-b (the rest)
    A="tests/plugins/quant_int tests/plugins/moe_triton"
    B="tests/core/test_graphs.py tests/plugins/cuda_fast tests/core/kernels tests/plugins/spec_mtp"
    case "$1" in tests-a) SEL=$A ;; tests-b) SEL=$B ;; *) SEL="$B $A" ;; esac
    t0=$(date +%s)
    timeout 540 python3 -m pytest -q -rf -m gpu -n $NW $SEL > "$OUT/t.txt" 2>&1
    echo "tests rc=$? $(( $(date +%s) - t0 )) s"
    tail -2 "$OUT/t.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -30
    if [ "$1" != tests-a ]; then
      # the batched-round tests run on CUDA when there is one (the fused bf16 verify, unmarked)
      timeout 40 python3 -m pytest -q -rf tests/plugins/spec_mtp/test_batched_rounds.py > "$OUT/t2.txt" 2>&1
      echo "batched rounds rc=$?"; tail -2 "$OUT/t2.txt"
    fi
    ;;
  folds)
    timeout 540 python3 bench/moe.py --out "$OUT/moe" --no-tests --recipes '' --budget-s 500 \
      --e2e int4,int4+lookahead,int4+nogdnab,nvfp4,nvfp4+lookahead > "$OUT/moe.txt" 2>&1
    echo "moe rc=$?"
    grep -A9 "^ninfer bench  " "$OUT/moe.txt"
    ;;
  kernels)
    timeout 540 python3 bench/moe.py --out "$OUT/moe" --no-tests --no-e2e --recipes int4 --budget-s 500 > "$OUT/moe.txt" 2>&1
    echo "moe rc=$?"
    grep -E "T= 1 " "$OUT/moe.txt" | head -20
    ;;
  dense)
    B="ninfer bench --model qwen3.6-27b --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
    timeout 120 $B --json "$OUT/b27.json" > "$OUT/b27.txt" 2>&1
    echo "27B int4 rc=$?"; grep -E "decode|roofline" "$OUT/b27.txt"
    NINFER_GEMV_GATED=1 timeout 100 $B --json "$OUT/b27_gated.json" > "$OUT/b27_gated.txt" 2>&1
    echo "27B int4 + silu*up inside down_proj rc=$?"; grep -E "decode|roofline" "$OUT/b27_gated.txt"
    NINFER_LOOKAHEAD=1 timeout 100 $B --json "$OUT/b27_ahead.json" > "$OUT/b27_ahead.txt" 2>&1
    echo "27B int4, steps launched ahead (NINFER_LOOKAHEAD=1) rc=$?"; grep -E "decode|roofline" "$OUT/b27_ahead.txt"
    NINFER_GDN_AB=0 timeout 100 $B --json "$OUT/b27_noab.json" > "$OUT/b27_noab.txt" 2>&1
    echo "27B int4, gates apart (NINFER_GDN_AB=0) rc=$?"; grep -E "decode|roofline" "$OUT/b27_noab.txt"
    timeout 150 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp.txt" 2>&1
    echo "mtp rc=$?"; tail -4 "$OUT/mtp.txt"
    ;;
  tune)
    # the drafter's shapes at M = 1 and 4 (all untuned: the default f16x2 config, the MMA kernel at
    # M = 4); paste OUT/tuned_h2.py's winners into quant_int/tuned.py
    timeout 540 python3 bench/h2_tune.py --out "$OUT" --budget-s 480 --pairs \
      "q8_g32:27b.gate_up_merged,q8_g32:27b.down_proj,q8_g32:27b.mtp.qkv_merged,q8_g32:27b.mtp.fc,q8_g32:27b.o_proj|out_proj,q4_g64:27b.shortlist_head" \
      > "$OUT/tune.txt" 2>&1
    echo "tune rc=$?"; tail -25 "$OUT/tune.txt"
    ;;
  profile)
    # the 27B step with the gates in the GDN step and apart, then the MTP round (drafting's share)
    P="python3 bench/profile_step.py --graph --model qwen3.6-27b --quant int4 --gen-len 16 --rows 30"
    timeout 170 $P --out "$OUT/p_ab" > "$OUT/p_ab.txt" 2>&1; echo "profile (gates in step) rc=$?"
    NINFER_GDN_AB=0 timeout 170 $P --out "$OUT/p_noab" > "$OUT/p_noab.txt" 2>&1; echo "profile (gates apart) rc=$?"
    timeout 200 $P --out "$OUT/p_mtp" --spec mtp --draft-tokens 3 --lm-head-draft > "$OUT/p_mtp.txt" 2>&1
    echo "profile (MTP round) rc=$?"
    for f in p_ab p_noab p_mtp; do echo "== $f"; head -25 "$OUT/$f.txt" | cut -c1-150; done
    ;;
  round)
    # the MTP round with the gates inside the verify launch (default) and apart; the 35B step's profile
    timeout 170 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp.txt" 2>&1
    echo "mtp rc=$?"; tail -4 "$OUT/mtp.txt"
    NINFER_GDN_AB=0 timeout 170 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp_noab.txt" 2>&1
    echo "mtp, gates apart rc=$?"; tail -4 "$OUT/mtp_noab.txt"
    timeout 200 python3 bench/profile_step.py --graph --model qwen3.6-35b-a3b --quant int4 --gen-len 16 --rows 70 \
      --out "$OUT/p35" > "$OUT/p35.txt" 2>&1
    echo "profile 35B rc=$?"; head -45 "$OUT/p35.txt" | cut -c1-160
    ;;
  ahead)
    timeout 200 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/spec_mtp/test_spec_gpu.py > "$OUT/t.txt" 2>&1
    echo "spec GPU tests rc=$?"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    timeout 40 python3 -m pytest -q -rf tests/plugins/spec_mtp/test_spec_ahead.py > "$OUT/t2.txt" 2>&1
    echo "ahead (stand-in graphs) rc=$?"; tail -1 "$OUT/t2.txt"
    timeout 150 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp.txt" 2>&1
    echo "mtp rc=$?"; tail -3 "$OUT/mtp.txt" | head -2
    NINFER_SPEC_AHEAD=0 timeout 120 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/mtp_noahead.txt" 2>&1
    echo "mtp, rounds not launched ahead (NINFER_SPEC_AHEAD=0) rc=$?"; tail -3 "$OUT/mtp_noahead.txt" | head -2
    grep -o '"ahead_rounds": [0-9]*' "$OUT"/*.json | head -3
    ;;
  tcd)
    # why qkv+z on the direct kernel at M = 1 won alone (28.0 vs 30.6 µs) and cost the step 0.55 ms
    B="ninfer bench --model qwen3.6-27b --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
    timeout 120 $B --json "$OUT/b27.json" > "$OUT/b27.txt" 2>&1; echo "27B rc=$?"; grep -E "decode|roofline" "$OUT/b27.txt"
    NINFER_TCD=1 timeout 100 $B --json "$OUT/b27_tcd.json" > "$OUT/b27_tcd.txt" 2>&1
    echo "27B, NINFER_TCD=1 rc=$?"; grep -E "decode|roofline" "$OUT/b27_tcd.txt"
    P="python3 bench/profile_step.py --graph --model qwen3.6-27b --quant int4 --gen-len 16 --rows 30"
    timeout 150 $P --out "$OUT/p" > "$OUT/p.txt" 2>&1; echo "profile rc=$?"
    NINFER_TCD=1 timeout 150 $P --out "$OUT/p_tcd" > "$OUT/p_tcd.txt" 2>&1; echo "profile (NINFER_TCD=1) rc=$?"
    for f in p p_tcd; do echo "== $f"; head -22 "$OUT/$f.txt" | cut -c1-150; done
    ;;
  first)
    t0=$(date +%s)
    timeout 280 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/quant_int/test_gemv_tc.py tests/core/kernels/test_triton_gdn.py \
      tests/plugins/spec_mtp/test_spec_gpu.py > "$OUT/t.txt" 2>&1
    echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    timeout 100 python3 bench/tc_tune.py --out "$OUT/down" --budget-s 80 --rank-m 4 --pairs "q5_g64:27b.down_proj" \
      --cands "8:0:4:6:2,8:0:4:4:2,8:0:4:8:2,17:0:4:6:2,4:0:4:6:2" > "$OUT/down.txt" 2>&1
    echo "down rc=$? $(( $(date +%s) - t0 )) s"; grep -E "M=4:|^q5" "$OUT/down.txt" | cut -c1-400
    rounds 100 "X=1" "NINFER_TC_LATE=1" "NINFER_GDN_SPLIT_NORM=1" "NINFER_MTP_SEED_ROWS=0"
    ;;
  commit)
    # the next session's first call: the GPU tests of what the last two sessions left untested on a
    # GPU (the commit kernel, the forced verify split, the drafting's rmsnorm_pair and argmax_rows,
    # the round's bookkeeping kernels, the sampler's new keywords), the commit alone (torch form
    # against the kernel), then the MTP round as committed / NINFER_GDN_COMMIT=0 (worst case 570 s;
    # `commit2` goes on from there)
    t0=$(date +%s)
    timeout 200 python3 -m pytest -q -rf -m gpu -n 4 tests/core/kernels/test_triton_commit.py tests/core/kernels/test_triton_gdn.py \
      tests/core/kernels/test_triton_argmax.py tests/core/kernels/test_triton_norms_pair.py tests/plugins/spec_mtp \
      tests/core/kernels/test_triton_spec_round.py tests/core/kernels/test_triton_sample.py \
      > "$OUT/t.txt" 2>&1
    echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/t.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    timeout 50 python3 -m pytest -q -rf tests/plugins/spec_mtp/test_batched_rounds.py tests/plugins/cuda_fast/test_decode_meta.py \
      > "$OUT/t2.txt" 2>&1
    echo "batched rounds, decode_meta (CUDA) rc=$?: $(tail -1 "$OUT/t2.txt")"
    timeout 40 python3 bench/commit_bench.py > "$OUT/commit.txt" 2>&1; echo "commit_bench rc=$?"; cat "$OUT/commit.txt"
    rounds 300 "X=1" "NINFER_GDN_COMMIT=0" "X=1" "NINFER_GDN_COMMIT=0" "NINFER_ROUND_IO=0" "NINFER_GDN_VERIFY_BV=16:2"
    ;;
  tail)
    # the decode step's tail inside the sampler (default) against NINFER_STEP_TAIL=0, alternated twice
    # in one process (weights built once); `tail 35b` (default) or `tail 27b`, one model a call
    t0=$(date +%s)
    case "${2:-35b}" in 27b) model=qwen3.6-27b ;; *) model=qwen3.6-35b-a3b ;; esac
    timeout 560 python3 bench/dense_27b.py --skip-tests --model $model --only int4_8k --budget-s 480 \
      --variants "X=1|NINFER_STEP_TAIL=0|X=1|NINFER_STEP_TAIL=0" > "$OUT/b.txt" 2>&1
    echo "$model tail A/B rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "^int4_8k|^skipped|ERROR" "$OUT/b.txt" | cut -c1-150
    ;;
  ablate)
    # where the f16x2 GEMV's time goes: the same kernel with and without its decode and FMAs at the
    # dispatched configs, then the read ceiling again (its tile walk now on every shape) (~5 min)
    t0=$(date +%s)
    timeout 240 python3 bench/h2_ablate.py --out "$OUT" > "$OUT/ablate.txt" 2>&1
    echo "h2_ablate rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/ablate.txt"
    timeout 300 python3 bench/read_ceiling.py --out "$OUT" > "$OUT/ceiling.txt" 2>&1
    echo "read_ceiling rc=$? $(( $(date +%s) - t0 )) s"; sed -n '/best per shape/,$p' "$OUT/ceiling.txt"
    ;;
  kwstep)
    # the K-walk GEMV in the engine, alternated twice in one process: without it (NINFER_KW=0), as
    # committed (tuned.TUNED_KW's winners, once kw_bench's tuned_kw.py is pasted there), and on every
    # M <= 4 decode GEMV it fits (NINFER_KW=1); `kwstep 27b` (default), `kwstep 35b`, `kwstep round`
    t0=$(date +%s)
    case "${2:-27b}" in
      round) rounds 560 "NINFER_KW=0" "X=1" "NINFER_KW=1" "NINFER_KW=0" "X=1" "NINFER_KW=1" ;;
      *)
        case "${2:-27b}" in 35b) model=qwen3.6-35b-a3b ;; *) model=qwen3.6-27b ;; esac
        timeout 560 python3 bench/dense_27b.py --skip-tests --model $model --only int4_8k --budget-s 480 \
          --variants "NINFER_KW=0|X=1|NINFER_KW=1|NINFER_KW=0|X=1|NINFER_KW=1" > "$OUT/b.txt" 2>&1
        echo "$model KW A/B rc=$? $(( $(date +%s) - t0 )) s"
        grep -E "^int4_8k|^skipped|ERROR" "$OUT/b.txt" | cut -c1-150 ;;
    esac
    ;;
  kw)
    t0=$(date +%s)
    timeout 150 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/quant_int/test_gemv_kw.py > "$OUT/t.txt" 2>&1
    echo "kw tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    # (its last lines: TUNED_KW entries for quant_int/tuned.py, also in OUT/tuned_kw.py)
    timeout 400 python3 bench/kw_bench.py --out "$OUT" > "$OUT/kw.txt" 2>&1
    echo "kw_bench rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/kw.txt" | cut -c1-150
    ;;
  block)
    # the decode MoE layer in one launch (moe_block.py, written without a GPU): its GPU tests (a hang
    # in its waits shows as the timeout), the per-layer timings at T = 1 and 4 (block against the
    # three launches), then the 35B step in one process (bench/dense_27b.py --variants): as committed,
    # with NINFER_MOE_BLOCK=1, with the post-mixer norm in the block too (NINFER_MOE_BLOCK_NORM=1),
    # alternated twice (~9 min)
    t0=$(date +%s)
    timeout 150 python3 -m pytest -q -rf -m gpu tests/plugins/moe_triton/test_moe_block.py > "$OUT/t.txt" 2>&1
    echo "block tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    timeout 150 python3 bench/moe.py --out "$OUT/k" --no-tests --no-e2e --recipes int4 --decode-t 1,4 --budget-s 120 \
      > "$OUT/k.txt" 2>&1
    echo "kernels rc=$? $(( $(date +%s) - t0 )) s"; grep -E "T= ?[14] |block" "$OUT/k.txt" | cut -c1-150
    timeout 300 python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k --budget-s 240 \
      --variants "X=1|NINFER_MOE_BLOCK=1|NINFER_MOE_BLOCK=1 NINFER_MOE_BLOCK_NORM=1|X=1|NINFER_MOE_BLOCK=1|NINFER_MOE_BLOCK=1 NINFER_MOE_BLOCK_NORM=1" \
      > "$OUT/e.txt" 2>&1
    echo "35B step A/B rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4_8k|^skipped|ERROR" "$OUT/e.txt" | cut -c1-150
    ;;
  prefill35)
    # the 35B's MoE prefill: the tile kernels against every expert decoded to bf16 + grouped GEMMs
    # (prefill_grouped.py, NINFER_MOE_PREFILL=grouped, written without a GPU): its GPU tests, then
    # the 35B int4 8K prefill and step in one process, alternated twice (~6 min)
    t0=$(date +%s)
    timeout 150 python3 -m pytest -q -rf -m gpu tests/plugins/moe_triton/test_moe_prefill_grouped.py > "$OUT/t.txt" 2>&1
    echo "grouped prefill tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    steps qwen3.6-35b-a3b 300 240 e.txt "35B prefill A/B" "X=1" "NINFER_MOE_PREFILL=grouped" "X=1" "NINFER_MOE_PREFILL=grouped"
    ;;
  go3)
    # the next session's first call: kw_bench again (ragged K shares for the 5,120-row matrices, the
    # 35B's head and qkv, the MTP drafter's shapes), then the 27B step with TUNED_KW (X=1) against
    # NINFER_KW=0 and NINFER_KW=1, alternated (~9.5 min worst case)
    t0=$(date +%s)
    timeout 110 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_kw.py > "$OUT/t.txt" 2>&1
    echo "K-walk GPU tests (table, ragged, L2 ahead) rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    timeout 300 python3 bench/kw_bench.py --out "$OUT" --budget-s 250 > "$OUT/kw.txt" 2>&1
    echo "kw_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^  q|^  nv|^copy|^prewarm|^#|^    \(" "$OUT/kw.txt" | cut -c1-150
    steps qwen3.6-27b $(( 590 - ($(date +%s) - t0) )) 130 e27.txt "27B table A/B" "X=1" "NINFER_KW=0" "NINFER_KW=1" "X=1"
    ;;
  tkw)
    t0=$(date +%s)
    timeout 150 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_tkw.py tests/plugins/quant_int/test_gemv_tc.py \
      > "$OUT/t.txt" 2>&1
    echo "TKW + TC GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    grep -E "Error|error:|assert" "$OUT/t.txt" | head -8 | cut -c1-300
    timeout 230 python3 bench/tkw_bench.py --out "$OUT" --budget-s 170 > "$OUT/tkw.txt" 2>&1
    echo "tkw_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^  q|^    TKW|^copy|^prewarm|^#|^    \(|best M|x prepared" "$OUT/tkw.txt" | cut -c1-150
    steps qwen3.6-27b $(( 420 - ($(date +%s) - t0) )) 60 e27.txt "27B TKW A/B" "X=1" "NINFER_TKW=1"
    rounds $(( 585 - ($(date +%s) - t0) )) "X=1" "NINFER_TKW=1"
    ;;
  pin)
    t0=$(date +%s)
    timeout 150 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_h2.py tests/plugins/quant_int/test_gemv_kw.py \
      -k "every_shape or fast_path" > "$OUT/t.txt" 2>&1
    echo "pinned GEMV GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    steps qwen3.6-27b 230 170 e27.txt "27B pin A/B" "X=1" "NINFER_PIN=1" "X=1" "NINFER_PIN=1"
    steps qwen3.6-35b-a3b $(( 585 - ($(date +%s) - t0) )) 120 e35.txt "35B pin A/B" "X=1" "NINFER_PIN=1" "X=1" "NINFER_PIN=1"
    ;;
  tkw2)
    t0=$(date +%s)
    timeout 150 python3 bench/tkw_bench.py --out "$OUT" --first 3 --ms 1,4 --budget-s 100 > "$OUT/tkw.txt" 2>&1
    echo "tkw_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^  q|^    TKW|^copy|best M" "$OUT/tkw.txt" | cut -c1-110
    timeout 200 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_tkw.py > "$OUT/t.txt" 2>&1
    echo "TKW GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    rounds $(( 560 - ($(date +%s) - t0) )) "NINFER_TKW=0" "X=1" "NINFER_TKW=0" "X=1"
    ;;
  ring)
    # the tensor-core K-walk's cp.async ring (TKWConfig.ring, written without a GPU): its GPU tests,
    # tkw_bench over the three big shapes (ring configs against the pinned winners), the 27B MTP round
    # with every dispatched TKW config on a 4-stage ring against as committed (~8 min)
    t0=$(date +%s)
    timeout 170 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_tkw.py \
      -k "R2 or R3 or R4 or R6 or graph_replay or xq" > "$OUT/t.txt" 2>&1
    echo "ring GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    timeout 130 python3 bench/tkw_bench.py --out "$OUT" --first 3 --ms 1,4 --set ring --budget-s 90 > "$OUT/tkw.txt" 2>&1
    echo "tkw_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^  q|^    TKW|^copy|best M" "$OUT/tkw.txt" | cut -c1-100
    rounds $(( 560 - ($(date +%s) - t0) )) "X=1" "NINFER_TKW_RING=3" "NINFER_TKW_RING=4" "X=1"
    ;;
  ring2)
    # the next session's first call (~9.5 min): the TKW GPU tests (the ring's among them, x's sums
    # in the ring too), tkw_bench --set ring on every shape and with NINFER_TKW_XS=1 on the big three,
    # the MTP round as committed (gate+up at M = 4 on the 3-stage ring) against NINFER_TKW_RING=0 (its
    # pinned register form) and NINFER_TKW_XS=1, the decode attention sweep at T = 1, 4
    t0=$(date +%s)
    timeout 120 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_tkw.py \
      tests/core/kernels/test_triton_attention.py > "$OUT/t.txt" 2>&1
    echo "TKW GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    timeout 140 python3 bench/tkw_bench.py --out "$OUT" --ms 1,4 --set ring --budget-s 100 > "$OUT/tkw.txt" 2>&1
    echo "tkw_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^  q|best M|^copy" "$OUT/tkw.txt" | cut -c1-100
    sed -n '/paste into/,$p' "$OUT/tkw.txt"
    NINFER_TKW_XS=1 timeout 80 python3 bench/tkw_bench.py --out "$OUT/xs" --first 3 --ms 1,4 --set ring --budget-s 50 \
      > "$OUT/tkw_xs.txt" 2>&1
    echo "tkw_bench, x sums in the ring rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^  q|R[0-9] " "$OUT/tkw_xs.txt" | cut -c1-100
    rounds 150 "X=1" "NINFER_TKW_RING=0" "NINFER_TKW_XS=1" "X=1"
    timeout $(( 580 - ($(date +%s) - t0) )) python3 bench/attn_sweep.py --out "$OUT" > "$OUT/a.txt" 2>&1
    echo "attn_sweep rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-120 "$OUT/a.txt" | head -30
    ;;
  next1)
    # the twentieth session's first call (~9.5 min; written for the nineteenth, which got no device),
    # for an H200 (every call of the eighteenth got an H100): GPU tests of the GDN replay and the
    # grouped MTP alignment, tkw_bench's ring set on every shape (the ring at M = 1 and the q4
    # shortlist head have only H100 times), the MTP round as committed against NINFER_GDN_REPLAY=1,
    # NINFER_TKW_TRY=1 and NINFER_ATTN_GROUPED=0
    t0=$(date +%s)
    # the GDN verify's replay buffers and commit (NINFER_GDN_REPLAY=1, written without a GPU) and the
    # MTP alignment's grouped attention: their GPU tests first, -v so a failure is named
    NINFER_GDN_REPLAY=1 timeout 100 python3 -m pytest -v -rf -m "gpu or not gpu" -n $NW \
      "tests/core/kernels/test_triton_gdn.py::test_verify_replay_real_shapes_gpu" \
      tests/plugins/spec_mtp/test_spec_gpu.py tests/plugins/spec_mtp/test_batched_rounds.py > "$OUT/t.txt" 2>&1
    echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(grep -c PASSED "$OUT/t.txt") passed"
    grep -E "FAILED|ERROR" "$OUT/t.txt" | cut -c1-200 | head -20
    timeout 150 python3 bench/tkw_bench.py --out "$OUT" --ms 1,4 --set ring --budget-s 110 > "$OUT/tkw.txt" 2>&1
    echo "tkw_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^copy|^  q|best M" "$OUT/tkw.txt" | cut -c1-100
    sed -n '/paste into/,$p' "$OUT/tkw.txt"
    # the plain steps "for the record" moved to `early` / `early2`, whose A/Bs include the tree as
    # committed (X=1): the rounds get the time
    rounds $(( 585 - ($(date +%s) - t0) )) "X=1" "NINFER_GDN_REPLAY=1" "NINFER_TKW_TRY=1" "NINFER_ATTN_GROUPED=0" "X=1" \
      "NINFER_GDN_REPLAY=1 NINFER_TKW_TRY=1"
    ;;
  early)
    # the nineteenth session's work, written without a GPU (~9.5 min), all off by default: reads
    # before the PDL wait that launch.late_dependents allows, the GDN decode step's recurrent state
    # (NINFER_GDN_EARLY=1) and the MoE pair down kernel's expert ids and weights (NINFER_MOE_EARLY=1);
    # the K-walk GEMV's x pairs written by the norm before it and reused (NINFER_KW_XREUSE=1). Their
    # GPU tests first (-v: bit-equal to the default, graph = eager, replay over changing routings),
    # then the 35B step and the 27B step, variants alternated in one process each
    t0=$(date +%s)
    early_tests 200
    ALL="NINFER_MOE_EARLY=1 NINFER_GDN_EARLY=1 NINFER_KW_XREUSE=1"
    steps qwen3.6-35b-a3b $(( 570 - ($(date +%s) - t0) )) 300 e35.txt "35B step" "X=1" "NINFER_MOE_EARLY=1" \
      "NINFER_GDN_EARLY=1" "NINFER_KW_XREUSE=1" "$ALL" "X=1" "$ALL"
    ;;
  early3|early4)
    # early and early2 in one call, for a session with device time for one (~9.5 min): the GPU
    # tests, then the 35B and the 27B steps with everything on against as committed, alternated,
    # each switch alone after that while the budget lasts; END (default 580): the call's seconds.
    # early4: about five minutes (END=300), the GPU tests and the 35B step only. The 35B's ALL adds
    # the twenty-first session's switches: the K-walk candidates of TUNED_KW_TRY (its head and
    # q+k+v), the post-mixer add + norm in route_gemv (NINFER_MOE_NORM, cheaper since its last
    # program keeps the row) and route_gemv's key top-k
    t0=$(date +%s)
    END=${END:-580}
    ALL="NINFER_MOE_EARLY=1 NINFER_GDN_EARLY=1 NINFER_KW_XREUSE=1"
    ALL35="$ALL NINFER_KW_TRY=1 NINFER_MOE_NORM=1 NINFER_ROUTE_TOPK=keys"
    if [ "$1" = early4 ]; then
      early_tests 130
      LIMIT35=$END BUDGET35=$(( END - 50 - ($(date +%s) - t0) ))
    else
      early_tests $(( END * 2 / 7 ))
      LIMIT35=$(( END * 11 / 16 )) BUDGET35=$(( END * 3 / 8 ))
    fi
    steps qwen3.6-35b-a3b $(( LIMIT35 - ($(date +%s) - t0) )) $BUDGET35 e35.txt "35B step" \
      "X=1" "$ALL35" "X=1" "$ALL35" "NINFER_MOE_EARLY=1" "NINFER_KW_TRY=1" "NINFER_MOE_NORM=1" "NINFER_GDN_EARLY=1" \
      "NINFER_KW_XREUSE=1" "NINFER_ROUTE_TOPK=keys"
    if [ "$1" = early3 ]; then
      steps qwen3.6-27b $(( END - ($(date +%s) - t0) )) $(( END - 80 - ($(date +%s) - t0) )) e27.txt "27B step" "X=1" \
        "NINFER_GDN_EARLY=1 NINFER_KW_XREUSE=1" "X=1" "NINFER_GDN_EARLY=1 NINFER_KW_XREUSE=1" "NINFER_GDN_EARLY=1" \
        "NINFER_KW_XREUSE=1"
    fi
    ;;
  h200)
    # the twenty-second session's first call, on an H200 (the twenty-first had only an H100): the plain
    # int4 steps of the 27B and the 35B-A3B with the new defaults (GDN_EARLY, MOE_EARLY, the 35B's
    # K-walk head and q+k+v), then the 27B MTP round as committed / NINFER_GDN_REPLAY=1 /
    # NINFER_KW_TRY=1 / both (~9.5 min)
    t0=$(date +%s)
    steps qwen3.6-27b 150 100 s27.txt "27B step" "X=1"
    steps qwen3.6-35b-a3b 150 100 s35.txt "35B step" "X=1"
    rounds $(( 585 - ($(date +%s) - t0) )) "X=1" "NINFER_GDN_REPLAY=1" "NINFER_KW_TRY=1" \
      "NINFER_GDN_REPLAY=1 NINFER_KW_TRY=1" "X=1" "NINFER_GDN_REPLAY=1 NINFER_KW_TRY=1"
    ;;
  replay)
    # the twenty-second session: where the MoE's captured rounds part from eager with rounds launched
    # ahead (bench/probe_lockstep.py --ahead), the MTP GPU tests with the GDN replay now the default
    # and the state columns made only where needed, then the 27B round against NINFER_GDN_REPLAY=0
    t0=$(date +%s)
    timeout 150 python3 bench/probe_lockstep.py --ahead 2>&1 | grep -vE "info|debug|warn" | tail -4
    echo "lockstep --ahead $(( $(date +%s) - t0 )) s"
    timeout 150 python3 -m pytest -q -rf -m "gpu or not gpu" -n $NW tests/plugins/spec_mtp/test_spec_gpu.py \
      tests/plugins/spec_mtp/test_batched_rounds.py -k "not moe_int4" > "$OUT/t.txt" 2>&1
    echo "MTP GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | cut -c1-200 | head
    rounds $(( 560 - ($(date +%s) - t0) )) "X=1" "NINFER_GDN_REPLAY=0" "X=1" "NINFER_GDN_REPLAY=0"
    ;;
  ahead2)
    # the twenty-second session's fix, written without a GPU: eager rounds run ahead on the captured
    # rounds' rule (the MoE int4 captured/eager test), with GDN replay and the drafter's K-walk
    # configs now defaults: the MTP GPU tests and the K-walk entries' GPU test (~3 min)
    t0=$(date +%s)
    timeout 200 python3 -m pytest -q -rf -m "gpu or not gpu" -n $NW tests/plugins/spec_mtp/test_spec_gpu.py \
      tests/plugins/spec_mtp/test_batched_rounds.py \
      "tests/plugins/quant_int/test_gemv_kw.py::test_gpu_35b_kw_entries_match_the_reference" > "$OUT/t.txt" 2>&1
    echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | cut -c1-200 | head
    ;;
  bars)
    # the issues' H200 bars with every default to date, one call (~9.5 min; ask for nvidia-h200 and
    # check the reply's device: an H100's figures are not the bars): the 27B int4 / nvfp4 / bf16 steps
    # at 8K, int4 at 131K with the INT8 cache, the 27B MTP round (shortlist head), then the 35B-A3B
    # int4 step and its MTP round, with the full head drafting and with the shortlist head (never run
    # on the 35B: three draft steps read the full q6 head, 0.4 GB each, against 0.14 GB for the
    # 131,072-row q4 shortlist; about -0.26 ms of the round's 5.07 on an H100, predicted)
    t0=$(date +%s)
    # a shorter call: BARS_S (all), BARS_27S (the 27B's share), BARS_27 / BARS_35 (the runs)
    B27S=${BARS_27S:-330}
    timeout $B27S python3 bench/dense_27b.py --skip-tests --only ${BARS_27:-int4_8k,nvfp4_8k,bf16_8k_alone,int4_131k_int8kv,int4_8k_mtp3_short} \
      --budget-s $(( B27S - 30 )) > "$OUT/b27.txt" 2>&1
    echo "27B rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "^(int4|nvfp4|bf16)|spec round|^skipped|ERROR" "$OUT/b27.txt" | cut -c1-150
    timeout $(( ${BARS_S:-585} - ($(date +%s) - t0) )) python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b \
      --only ${BARS_35:-int4_8k,int4_8k_mtp3,int4_8k_mtp3_short} --budget-s $(( ${BARS_S:-585} - 65 - ($(date +%s) - t0) )) > "$OUT/b35.txt" 2>&1
    echo "35B rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "^int4|spec round|projection|^skipped|ERROR" "$OUT/b35.txt" | cut -c1-150
    ;;
  gdnbv)
    # the GDN kernels' value columns a program and warps (~3 min): bench/gdn_columns.py over BV:warps
    # in the replay form the round uses, the decode step split or whole; then the 27B MTP round with
    # NINFER_GDN_VERIFY_BV against the default (run on an H100 in the twenty-third session: the
    # defaults, 32:4 and whole heads, won; one warp lost 2x; the round part never ran)
    t0=$(date +%s)
    timeout 200 python3 bench/gdn_columns.py --variants 32:4:pr,32:2:pr,16:2:pr,64:4:pr,64:2:pr,32:4:p \
      --decode-variants 128:4:p,128:8:p,32:4:p,32:2:p,16:2:p > "$OUT/gc.txt" 2>&1
    echo "gdn_columns rc=$? $(( $(date +%s) - t0 )) s"; grep -E "us/layer|MISMATCH|Error|floor" "$OUT/gc.txt" | cut -c1-150
    timeout $(( 570 - ($(date +%s) - t0) )) python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short \
      --budget-s $(( 500 - ($(date +%s) - t0) )) --variants "${GDNBV_VARIANTS:-X=1|NINFER_GDN_VERIFY_BV=16:2|NINFER_GDN_VERIFY_BV=32:2|X=1}" \
      > "$OUT/r.txt" 2>&1
    echo "rounds rc=$? $(( $(date +%s) - t0 )) s"; grep -E "spec round|^skipped|ERROR" "$OUT/r.txt" | cut -c1-150
    ;;
  gates)
    # the GDN gates' dot products before the PDL wait (NINFER_GDN_GATES_EARLY=1, written after the
    # gdnncu profile: about half the verify columns' launch was its token-by-token gate dots): the
    # GPU tests, then the 27B plain step and MTP round alternated (~4 min warm; on a cold machine
    # GATES_S=560: the first 27B run compiles and captures for over 2.5 min)
    t0=$(date +%s)
    timeout 120 python3 -m pytest -q -rf -m gpu -n 2 tests/core/kernels/test_triton_gdn.py \
      -k "gates_early or state_early or gates_from" > "$OUT/t.txt" 2>&1
    echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"
    timeout $(( ${GATES_S:-330} - ($(date +%s) - t0) )) python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short \
      --budget-s $(( ${GATES_S:-330} - 30 - ($(date +%s) - t0) )) \
      --variants "X=1|NINFER_GDN_GATES_EARLY=1|X=1|NINFER_GDN_GATES_EARLY=1" > "$OUT/r27.txt" 2>&1
    echo "27B rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4|spec round|^skipped|ERROR" "$OUT/r27.txt" | cut -c1-150
    ;;
  moe5)
    # the 35B-A3B's plain step and MTP round, each of the twenty-third session's changes against its
    # off switch, alternated (all three kept after the twenty-fourth session's run): the GDN gates
    # before the PDL wait (NINFER_GDN_GATES_EARLY=0 is without), pair down's one-load combine
    # (NINFER_MOE_COMBINE_LOOP=1 is the loop); the route kernel's former shared-gate loop
    # (NINFER_ROUTE_SG_LOOP) is removed; first the router and pair GPU tests (~7 min warm;
    # cold: MOE5_S=590)
    t0=$(date +%s)
    gpu_tests ${MOE5_T:-150} tests/plugins/moe_triton/test_moe_router.py tests/plugins/moe_triton/test_moe_pairs.py
    rounds35 ${MOE5_S:-560} "X=1|NINFER_GDN_GATES_EARLY=0|NINFER_MOE_COMBINE_LOOP=1"
    ;;
  split)
    # the split kernels' arrivals as a release each and one acquire fence in the last CTA, with a
    # relaxed re-arm (default since the twenty-fourth session) against NINFER_SPLIT_ACQ_REL=1 (each
    # arrival acq_rel: an L1 invalidation in every CTA; the pairncu profile had ~5% of the pair
    # kernels' stall samples on it and 25-36% in the arrival tail). The switch is read at import,
    # so each side is its own process: GPU tests of every kernel that changed, then the model
    # (SPLIT_M, default the 35B) one process a side, alternated until SPLIT_S (default 580) s
    t0=$(date +%s)
    timeout ${SPLIT_T:-200} python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/moe_triton/test_moe_pairs.py \
      tests/plugins/moe_triton/test_moe_router.py tests/plugins/quant_int/test_gemv_h2.py tests/plugins/quant_int/test_gemv_kw.py \
      tests/plugins/quant_int/test_skinny.py tests/core/kernels/test_triton_sample.py tests/core/kernels/test_triton_argmax.py \
      tests/core/kernels/test_triton_gdn.py ${SPLIT_TESTS:-} > "$OUT/t.txt" 2>&1
    echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    i=0
    for side in X=1 NINFER_SPLIT_ACQ_REL=1 X=1 NINFER_SPLIT_ACQ_REL=1 X=1 NINFER_SPLIT_ACQ_REL=1; do
      left=$(( ${SPLIT_S:-580} - ($(date +%s) - t0) ))
      if [ $left -lt 100 ]; then echo "skipped $side: $left s left"; continue; fi
      i=$((i + 1))
      env $side timeout $left python3 bench/dense_27b.py --skip-tests --model ${SPLIT_M:-qwen3.6-35b-a3b} \
        --only int4_8k_mtp3_short --budget-s $((left - 20)) > "$OUT/s$i.txt" 2>&1
      echo "$side rc=$? $(( $(date +%s) - t0 )) s"
      grep -E "^int4|spec round|ERROR" "$OUT/s$i.txt" | cut -c1-150
    done
    ;;
  onek)
    # gate_up with one K slice (kbs = H / 128: each chunk finished in its only CTA, no counter,
    # no release; pairncu had 25-36% of the pair kernels' stall samples in the arrival tail) and
    # down with fewer rows a chunk (more CTAs): GPU tests, the pair sweep at T = 1 and 4 over
    # those configs against the defaults, then the 35B step and round with NINFER_PAIR_GATE_UP /
    # NINFER_PAIR_DOWN (~8 min warm; cold ONEK_S=590)
    t0=$(date +%s)
    gpu_tests ${ONEK_T:-150} tests/plugins/moe_triton/test_moe_pairs.py -k "one_slice or real_shapes or replay"
    NINFER_SWEEP_ONEK=1 timeout 150 python3 bench/moe.py --out "$OUT/k" --no-tests --no-e2e --recipes int4 --pair-sweep \
      --sweep-only --budget-s 120 > "$OUT/k.txt" 2>&1
    echo "pair sweep rc=$? $(( $(date +%s) - t0 )) s"; grep -E "pair sweep|Error" "$OUT/k.txt" | cut -c1-150
    rounds35 ${ONEK_S:-570} \
      "X=1|NINFER_PAIR_GATE_UP=${ONEK_A:-8:16:8:4}|NINFER_PAIR_GATE_UP=${ONEK_B:-8:16:16:4}|NINFER_PAIR_DOWN=${ONEK_D:-16:4:16:2}"
    ;;
  go7)
    # the twenty-fourth session's 35B experiments in one call (no pair sweep): the GPU tests of
    # the one-slice gate_up and the small-chunk down, then the 35B step and round with each
    # against the defaults, and NINFER_L2PF beside them, alternated twice in one process (~9 min
    # warm; cold GO7_S=590 GO7_T=200). Run on 2026-12-06: both configs are the defaults since; the
    # routers' and gate_up's bulk L2 prefetches (NINFER_MOE_L2PF, NINFER_MOE_DOWN_L2PF) lost and
    # are removed
    t0=$(date +%s)
    gpu_tests ${GO7_T:-150} tests/plugins/moe_triton/test_moe_pairs.py tests/plugins/moe_triton/test_moe_router.py \
      -k "one_slice or real_shapes"
    rounds35 ${GO7_S:-580} \
      "X=1|NINFER_PAIR_GATE_UP=8:16:8:4|NINFER_PAIR_DOWN=16:4:16:2|NINFER_L2PF=16|NINFER_GDN_VERIFY_BV=32:4"
    ;;
  go8)
    # the twenty-fifth session's second: one-slice gate_up (8:16:8:4) and 16-row down (16:4:16:2)
    # are the defaults now; the MoE, 35B MTP and fused-path GPU tests under them, then the 35B step
    # and round against neighbouring configs (narrower trips, more or fewer warps), alternated twice
    # (~9 min warm; GO8_T, GO8_S)
    t0=$(date +%s)
    gpu_tests ${GO8_T:-240} tests/plugins/moe_triton tests/plugins/spec_mtp/test_spec_gpu.py \
      tests/plugins/cuda_fast/test_fused_path.py -k "moe or pair or route or block or 35b or a3b or grouped"
    G=NINFER_PAIR_GATE_UP; D=NINFER_PAIR_DOWN
    rounds35 ${GO8_S:-590} \
      "X=1|$G=4:16:4:2|$G=4:16:8:2|$G=8:16:8:8|$D=8:4:8:2|$D=16:4:16:4|$D=8:4:16:2"
    ;;
  go9)
    # the twenty-fifth session's last switches: the grouped MoE prefill (prefill_grouped.py,
    # NINFER_MOE_PREFILL=grouped; GPU-tested, never timed) against the tile kernels on the 35B's 8K
    # prefill, then the 35B round with the verify's 4 tokens routed by route_gemv (one launch
    # instead of the router linear + `route`: NINFER_ROUTE_GEMV_T=4), on 1 or 4 warps a program,
    # with the key top-k, alternated twice (~9 min warm; cold GO9_S=590)
    t0=$(date +%s)
    gpu_tests ${GO9_T:-150} tests/plugins/moe_triton/test_moe_router.py tests/plugins/moe_triton/test_moe_prefill_grouped.py \
      -k "route_gemv_real_shapes or grouped_prefill"
    steps qwen3.6-35b-a3b $(( ${GO9_P:-330} - ($(date +%s) - t0) )) $(( ${GO9_P:-330} - 40 - ($(date +%s) - t0) )) p35.txt \
      "35B prefill A/B" "X=1" "NINFER_MOE_PREFILL=grouped" "X=1" "NINFER_MOE_PREFILL=grouped"
    R=NINFER_ROUTE_GEMV_T=4
    rounds35 ${GO9_S:-590} "X=1|$R|$R NINFER_ROUTE_GEMV_WARPS=4|$R NINFER_ROUTE_TOPK=keys"
    ;;
  qbars)
    # issue 3's figures as the engine runs them (bench/quant_bars.py, written in the twenty-fifth
    # session: bench/quant_linear.py times the tile kernel's configs, not the decode dispatch): every
    # 27B and 35B shape in int4 and nvfp4 at M = 1, 4, 8, 16 (graph replays over copies) and 1024
    # (dequant + cuBLAS), the copy bandwidth, bf16 cuBLAS and torch's int4 in the same run (~8 min)
    t0=$(date +%s)
    timeout ${QBARS_S:-570} python3 bench/quant_bars.py --out "$OUT" --budget-s $(( ${QBARS_S:-570} - 110 )) > "$OUT/qb.txt" 2>&1
    echo "quant_bars rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^\|" "$OUT/qb.txt" | tail -40 | cut -c1-200
    ;;
  go10)
    # the grouped MoE prefill on by default from 5,120 tokens a call (twenty-ninth run: +15% at one
    # 8,192-token chunk, -20% at 2,048): its GPU tests and the 35B model's, then the threshold's
    # neighbourhood (4,096-token chunks, tiles against grouped) and chunks past 8,192 (16K prompts
    # in chunks of 8,192 against 16,384; the 35B grouped and tiles, the 27B), a process each (~5 min)
    t0=$(date +%s)
    gpu_tests 150 tests/plugins/moe_triton/test_moe_prefill_grouped.py tests/plugins/moe_triton/test_moe_gpu_model.py \
      tests/core/test_memory.py
    for run in qwen3.6-35b-a3b:4096:tiles:8192 qwen3.6-35b-a3b:4096:grouped:8192 qwen3.6-35b-a3b:8192:grouped:16384 \
               qwen3.6-35b-a3b:16384:grouped:16384 qwen3.6-35b-a3b:8192:tiles:16384 qwen3.6-35b-a3b:16384:tiles:16384 \
               qwen3.6-27b:8192::16384 qwen3.6-27b:16384::16384; do
      IFS=: read -r m c g p <<< "$run"
      f="$OUT/go10_${m}_${p}_$c$g"
      NINFER_MOE_PREFILL=${g:-grouped} NINFER_MOE_PREFILL_MIN_T=4096 timeout $(( ${GO10_S:-570} - ($(date +%s) - t0) )) \
        ninfer bench --model $m --random-weights --quant int4 --prompt-len $p --gen-len 8 --prefill-chunk $c --json "$f.json" > "$f.txt" 2>&1
      echo "$m prompt $p chunk $c $g rc=$? $(( $(date +%s) - t0 )) s: $(grep -E "^  prefill " "$f.txt" | head -1)"
    done
    ;;
  nvf16)
    # the NVFP4 layout "g16-split8-f16" (written without a GPU: 10 decode instructions a word of 8
    # codes against 15; SASS a weight at M = 1, f16x2 GEMV 4.02 -> 3.40, K-walk BW128 3.38 -> 2.76):
    # every NVFP4 GPU test (the K-walk candidates' too, NINFER_KW_TRY=1), then the 27B nvfp4 step as
    # committed and without the K-walk table (NINFER_KW=0), alternated (~9.5 min; NVF_S: the step's
    # share). Run 2026-12-06 with NINFER_KW_TRY=1 as the other side, whose 27B NVFP4 entries then
    # moved into TUNED_KW
    t0=$(date +%s)
    NINFER_KW_TRY=1 gpu_tests ${NVF_T:-260} tests/plugins/quant_nvfp4 tests/plugins/quant_int tests/plugins/moe_triton \
      -k "nvfp4 or fp4 or kw_entries"
    left=$(( ${NVF_S:-585} - ($(date +%s) - t0) ))
    if [ "$left" -gt 150 ]; then
      timeout $left python3 bench/dense_27b.py --skip-tests --only nvfp4_8k --budget-s $(( left - 60 )) \
        --variants "${NVF_V:-X=1|NINFER_KW=0|X=1|NINFER_KW=0}" > "$OUT/nv.txt" 2>&1
      echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/nv.txt" | cut -c1-150
    else
      echo "27B nvfp4 skipped ($left s left)"
    fi
    ;;
  kwh200)
    # TUNED_KW (the K-walk table every M <= 4 decode GEMV of the 27B takes) was tuned on an H100
    # and never by kw_bench on an H200, where the 27B step reads at 53% of copy against 66% on an
    # H100 (nineteenth run: gate+up 33.4 us, 67%; q5 down 26.45 us, 53%): the 27B's five big shapes
    # over every K-walk config at M = 1 and 4 (~6 min)
    t0=$(date +%s)
    timeout ${KWH_S:-400} python3 bench/kw_bench.py --out "$OUT" --first 5 --ms ${KWH_MS:-1,4} \
      --budget-s $(( ${KWH_S:-400} - 90 )) > "$OUT/kw.txt" 2>&1
    echo "kw_bench rc=$? $(( $(date +%s) - t0 )) s"; grep -vE "^ +[0-9]" "$OUT/kw.txt" | tail -60 | cut -c1-160
    ;;
  busy)
    # the busy prefill chunk (--prefill-chunk-busy, default 2,048, written without a GPU): 4 streams
    # decoding while a 16K prompt prefills, their longest gap between two tokens and the prompt's
    # time to first token, at busy chunks of 1,024 / 2,048 / 4,096 / 16,384 (bench/busy_stall.py;
    # the 27B then the 35B-A3B, int4, a process each; ~4 min)
    t0=$(date +%s)
    for m in qwen3.6-27b qwen3.6-35b-a3b; do
      left=$(( ${BUSY_S:-280} - ($(date +%s) - t0) ))
      [ "$left" -gt 60 ] || { echo "$m skipped ($left s left)"; continue; }
      timeout $left python3 bench/busy_stall.py --model $m --quant int4 \
        --prompt-len 16384 --busy 1024,2048,4096,16384 --json "$OUT/busy_$m.json" > "$OUT/busy_$m.txt" 2>&1
      echo "$m rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^\{|built|Error" "$OUT/busy_$m.txt" | cut -c1-200
    done
    ;;
  go11)
    # prefill chunks past 16,384 (twenty-ninth run: 16K prompts in one chunk against two of 8,192,
    # 35B-A3B grouped +33%, 27B +8%; each chunk decodes the experts / dense weights again): 32K
    # prompts in chunks of 16,384 against one of 32,768, the 35B-A3B grouped and the 27B, with each
    # run's peak GPU memory and plan, a process each (~6 min)
    t0=$(date +%s)
    for run in qwen3.6-35b-a3b:16384 qwen3.6-35b-a3b:32768 qwen3.6-27b:16384 qwen3.6-27b:32768; do
      IFS=: read -r m c <<< "$run"
      f="$OUT/go11_${m}_$c"
      left=$(( ${GO11_S:-560} - ($(date +%s) - t0) ))
      [ "$left" -gt 60 ] || { echo "$m chunk $c skipped ($left s left)"; continue; }
      timeout $left ninfer bench --model $m --random-weights --quant int4 \
        --prompt-len 32768 --gen-len 8 --prefill-chunk $c --json "$f.json" > "$f.txt" 2>&1
      echo "$m prompt 32768 chunk $c rc=$? $(( $(date +%s) - t0 )) s: $(grep -E "^  prefill " "$f.txt" | head -1)"
      python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['memory']; print('   peak', m['peak_serving_gib'], 'resident', m['resident_after_build_gib'], 'plan', m['plan'])" "$f.json" 2>/dev/null
    done
    ;;
  chunks)
    # `ninfer bench` prefills a prompt in one chunk (up to 8,192); `ninfer` and `ninfer serve` took
    # --prefill-chunk 1024 until the twenty-seventh session and now take the largest of 8192 / 4096 /
    # 2048 / 1024 the memory plan fits (memory.choose_prefill_chunk), chosen by arithmetic: each chunk
    # decodes the dense weights again (dequant + cuBLAS from 128 rows) and the MoE reads its experts
    # again, and the grouped MoE prefill (from 2,048 tokens a call) is never taken at 1024. The 8K
    # prefill at chunks of 1024 / 2048 / 8192 measures it: the 27B, the 35B on the tiles, the 35B
    # grouped (NINFER_MOE_PREFILL=grouped, from 1,024 tokens a call here), a process each (~8 min)
    t0=$(date +%s)
    for run in qwen3.6-27b:1024 qwen3.6-27b:2048 qwen3.6-27b:8192 qwen3.6-35b-a3b:1024 qwen3.6-35b-a3b:2048 \
               qwen3.6-35b-a3b:8192 qwen3.6-35b-a3b:1024:grouped qwen3.6-35b-a3b:2048:grouped qwen3.6-35b-a3b:8192:grouped; do
      IFS=: read -r m c g <<< "$run"
      NINFER_MOE_PREFILL=${g:-tiles} NINFER_MOE_PREFILL_MIN_T=1024 timeout $(( ${CHUNKS_S:-570} - ($(date +%s) - t0) )) ninfer bench --model $m --random-weights \
        --quant int4 --prompt-len 8192 --gen-len 8 --prefill-chunk $c --json "$OUT/chunk_${m}_$c$g.json" \
        > "$OUT/chunk_${m}_$c$g.txt" 2>&1
      echo "$m chunk $c $g rc=$? $(( $(date +%s) - t0 )) s: $(grep -E "^  prefill " "$OUT/chunk_${m}_$c$g.txt" | head -1)"
    done
    ;;
  kwncu35)
    # the 35B step reads 1.94 of its 2.52 GB of weights in dense q8 projections with K = 2048 or
    # 4096 (the routed experts 0.58): what their dispatched M = 1 GEMVs wait on, one launch each
    for shp in 12288:2048 9216:2048 2048:4096; do
      IFS=: read -r n k <<< "$shp"
      timeout 150 ncu --clock-control none --set full --import-source yes -k regex:'_gemv_kw_kernel|_gemv_h2|_tkw|_gemv_tc' \
        -s 3 -c 1 -o "$OUT/kw35_${n}_$k" python3 bench/ncu_linear.py --scheme q8_g32 --n $n --k $k --m 1 --path dispatch \
        > "$OUT/kw35_${n}_$k.log" 2>&1
      echo "q8 ${n}x$k rc=$?"; python3 bench/ncu_summary.py "$OUT/kw35_${n}_$k.ncu-rep" --regions 8 | cut -c1-160
    done
    ;;
  gdnbv35)
    # the 35B-A3B's GDN verify columns over BV:warps (never swept: its 32 value heads take the
    # default split BV 16 on 4 warps, 256 programs; the 27B's 48 take 32:4) and its decode step,
    # then the 35B round with the best candidates (~4 min)
    t0=$(date +%s)
    timeout 200 python3 bench/gdn_columns.py --model 35b --variants 16:4:pr,32:4:pr,16:2:pr,32:2:pr,64:4:pr,16:4:p \
      --decode-variants 128:4:p,128:8:p,32:4:p,16:4:p > "$OUT/gc.txt" 2>&1
    echo "gdn_columns rc=$? $(( $(date +%s) - t0 )) s"; grep -E "us/layer|MISMATCH|Error|floor" "$OUT/gc.txt" | cut -c1-150
    rounds35 ${GDNBV35_S:-450} "X=1|NINFER_GDN_VERIFY_BV=32:4|NINFER_GDN_VERIFY_BV=16:2"
    ;;
  gdnncu)
    # what the GDN verify columns (replay, BV 32, 4 warps: 17.6 us a layer against the decode
    # step's 9.1, H100) wait on: Nsight Compute's full set for one launch of each (~1 min)
    for k in _gdn_columns_kernel _gdn_decode_kernel; do
      timeout 240 ncu --clock-control none --set full --import-source yes -k regex:$k -s 3 -c 1 \
        -o "$OUT/$k" python3 bench/gdn_ncu.py > "$OUT/$k.log" 2>&1
      echo "$k rc=$?"; python3 bench/ncu_summary.py "$OUT/$k.ncu-rep"
    done
    ;;
  pairncu)
    # what the 35B's decode MoE pair kernels wait on at T = 1 and 4 (the verify's MoE: +1.05 ms of
    # the 35B round over its plain step, H100): Nsight Compute, one launch each (~2 min)
    for t in 1 4; do
      for k in _pair_gate_up_kernel _pair_down_kernel; do
        timeout 200 ncu --clock-control none --set full --import-source yes -k regex:$k -s 3 -c 1 \
          -o "$OUT/${k}_t$t" python3 bench/pair_ncu.py --t $t > "$OUT/${k}_t$t.log" 2>&1
        echo "$k T=$t rc=$?"; python3 bench/ncu_summary.py "$OUT/${k}_t$t.ncu-rep" --regions 8
      done
    done
    ;;
  p35)
    # where the 35B-A3B's time goes (~7 min): its plain int4 step and its MTP round (K = 3, a verify
    # of 4 on the pair kernels: 4.27 of the round's 5.07 ms on an H100), by kernel, graph replays
    P="python3 bench/profile_step.py --graph --model qwen3.6-35b-a3b --quant int4 --gen-len 16 --rows 40"
    timeout 200 $P --out "$OUT/p35" > "$OUT/p35.txt" 2>&1; echo "profile 35B step rc=$?"
    head -44 "$OUT/p35.txt" | cut -c1-150
    timeout 300 $P --out "$OUT/p35m" --spec mtp --draft-tokens 3 > "$OUT/p35m.txt" 2>&1
    echo "profile 35B round rc=$?"; head -44 "$OUT/p35m.txt" | cut -c1-150
    ;;
  int8)
    # the 27B --quant int8 step (q8 everywhere): since the twenty-second session its q8 gate+up, down
    # and q+k+v at M = 1 take the K-walk entries the MTP drafter won with (untimed for this model),
    # against NINFER_KW=0 (no K-walk entry anywhere), alternated (~4 min)
    t0=$(date +%s)
    timeout 280 python3 bench/dense_27b.py --skip-tests --only int8_8k --budget-s 220 \
      --variants "X=1|NINFER_KW=0|X=1|NINFER_KW=0" > "$OUT/i8.txt" 2>&1
    echo "27B int8 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int8|^skipped|ERROR" "$OUT/i8.txt" | cut -c1-150
    ;;
  probe)
    # the twenty-first session's last call: where the medium int4 35B-A3B's batched captured MTP
    # rounds part from the eager ones (test_moe_int4_captured_rounds_give_the_eager_rounds_tokens
    # fails: first difference at sequence 0, token 36; one sequence at a time they agree; each
    # mode is deterministic), then the MTP GPU tests under NINFER_GDN_REPLAY=1 NINFER_TKW_TRY=1
    t0=$(date +%s)
    timeout 260 python3 bench/probe_moe_spec2.py 2>&1 | grep -vE "info|debug|warn" | tail -14
    echo "probe $(( $(date +%s) - t0 )) s"
    # the same requests on a captured and an eager engine in lockstep: the first step where a slot's
    # state (GDN, K/V, MTP K/V, drafts) differs, and in what
    timeout 100 python3 bench/probe_lockstep.py 2>&1 | grep -vE "info|debug|warn" | tail -4
    echo "lockstep $(( $(date +%s) - t0 )) s"
    NINFER_GDN_REPLAY=1 NINFER_TKW_TRY=1 timeout 120 python3 -m pytest -q -rf -m gpu -n $NW \
      tests/plugins/spec_mtp/test_spec_gpu.py tests/plugins/spec_mtp/test_batched_rounds.py -k "not moe_int4" > "$OUT/t.txt" 2>&1
    echo "MTP GPU tests (replay) rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | cut -c1-200 | head
    ;;
  nvtile) nvtile_run ;;
  kwdq) kwdq_run ;;
  kwnv)
    # kwdq then nvtile, one call (~8.5 min): auto's call on a card that is not an H200
    KWDQ_S=${KWDQ_S:-220} kwdq_run; nvtile_run
    ;;
  dqkw)
    # a short call: the NVFP4 dequant's GPU test and bench/dq_bench.py (run 2026-12-06 with the three store forms), then
    # kw_bench over the NVFP4 down, q+v and qkv+z for what is left of DQKW_S (~6 min)
    t0=$(date +%s)
    timeout 60 python3 -m pytest -q -m gpu tests/plugins/quant_int/test_dequant.py -k "every_code and nvfp4" > "$OUT/dqt.txt" 2>&1
    echo "dequant GPU test rc=$?: $(tail -1 "$OUT/dqt.txt")"
    timeout 100 python3 bench/dq_bench.py --shapes nvfp4:34816x5120,q4_g64:34816x5120,nvfp4:5120x17408 > "$OUT/dq.txt" 2>&1
    echo "dq_bench rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-200 "$OUT/dq.txt"
    left=$(( ${DQKW_S:-380} - ($(date +%s) - t0) ))
    if [ "$left" -gt 120 ]; then
      timeout $left python3 bench/kw_bench.py --out "$OUT" --budget-s $(( left - 60 )) --ms 1 \
        --shapes nvfp4:5120x17408,nvfp4:13312x5120,nvfp4:16384x5120 > "$OUT/kwb.txt" 2>&1
      echo "kw_bench rc=$? $(( $(date +%s) - t0 )) s"
      grep -E "dispatched|prewarm|budget|ERROR|Error" "$OUT/kwb.txt" | cut -c1-150
      grep -E "^    \(|^#" "$OUT/kwb.txt" | head -20
    fi
    ;;
  nvkwb)
    # kw_bench over the NVFP4 shapes (the 27B nvfp4 recipe's gate+up, down, qkv+z, q+v, o_proj;
    # the 35B-A3B's qkvz and q+k+v) at M = 1 and 4, with the g16-split8-f16 decode: their K-walk
    # entries were the int winners' configs (TUNED_KW_TRY) or tuned on the old decode (down) (~7 min)
    t0=$(date +%s)
    timeout ${NVKWB_S:-420} python3 bench/kw_bench.py --out "$OUT" --budget-s $(( ${NVKWB_S:-420} - 90 )) --ms ${NVKWB_MS:-1,4} \
      --shapes ${NVKWB_SHAPES:-nvfp4:34816x5120,nvfp4:5120x17408,nvfp4:16384x5120,nvfp4:13312x5120,nvfp4:5120x6144,nvfp4:12288x2048,nvfp4:9216x2048} \
      > "$OUT/kwb.txt" 2>&1
    echo "kw_bench rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "dispatched|prewarm|budget|ERROR|Error" "$OUT/kwb.txt" | cut -c1-150
    grep -E "^    \(|^#" "$OUT/kwb.txt" | head -40
    # the prefill's dequantize alone and at M = 1024, by format (~30 s)
    timeout 60 python3 -m pytest -q -m gpu tests/plugins/quant_int/test_dequant.py -k "every_code and nvfp4" > "$OUT/dqt.txt" 2>&1
    echo "dequant GPU test rc=$?: $(tail -1 "$OUT/dqt.txt")"
    timeout 90 python3 bench/dq_bench.py > "$OUT/dq.txt" 2>&1; echo "dq_bench rc=$?"; cut -c1-200 "$OUT/dq.txt"
    ;;
  nvkw)
    # the 27B --quant nvfp4 step (52.6% of the roofline on an H100 against int4's 66%): its NVFP4
    # gate+up, qkv+z and q+v and its q8 head on the K-walk with the configs of the int winners of
    # the same shapes (TUNED_KW_TRY, NINFER_KW_TRY=1; they ran on the f16x2 GEMV), against as
    # committed, alternated, then every M <= 4 launch on the K-walk (NINFER_KW=1); then the int8 step
    # (its q8 head, qkv+z, q+v, o_proj). The entries' GPU test first (~8 min). The 27B NVFP4 entries
    # won on 2026-12-06 (nvf16) and are in TUNED_KW now: the nvfp4 variants compare nothing new
    t0=$(date +%s)
    NINFER_KW_TRY=1 timeout 120 python3 -m pytest -q -rf -m gpu \
      "tests/plugins/quant_int/test_gemv_kw.py::test_gpu_35b_kw_entries_match_the_reference" > "$OUT/t.txt" 2>&1
    echo "KW_TRY GPU test rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"
    timeout $(( ${NVKW_S:-380} - ($(date +%s) - t0) )) python3 bench/dense_27b.py --skip-tests --only nvfp4_8k \
      --budget-s $(( ${NVKW_S:-380} - 60 - ($(date +%s) - t0) )) --variants "${NVKW_V:-X=1|NINFER_KW_TRY=1|X=1|NINFER_KW_TRY=1|NINFER_KW=1}" > "$OUT/nv.txt" 2>&1
    echo "27B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/nv.txt" | cut -c1-150
    # a short call: NVKW_V (the nvfp4 variants), NVKW_S (their share), NVKW_INT8=0 (no int8 run);
    # NVKW35=1 adds the 35B-A3B nvfp4 step (NVKW35_ALL: the call's whole share then)
    left=$(( ${NVKW_ALL:-550} - ($(date +%s) - t0) ))
    if [ "${NVKW_INT8:-1}" != 0 ] && [ "$left" -gt 120 ]; then
      timeout $left python3 bench/dense_27b.py --skip-tests --only int8_8k --budget-s $(( left - 50 )) \
        --variants "X=1|NINFER_KW_TRY=1" > "$OUT/i8.txt" 2>&1
      echo "27B int8 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int8|^skipped|ERROR" "$OUT/i8.txt" | cut -c1-150
    else
      echo "27B int8 skipped ($left s left)"
    fi
    left=$(( ${NVKW35_ALL:-560} - ($(date +%s) - t0) ))
    if [ -n "${NVKW35:-}" ] && [ "$left" -gt 120 ]; then
      # the 35B-A3B nvfp4 step: its NVFP4 qkvz / q+k+v and q8 head on the K-walk
      timeout $left python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only nvfp4_8k \
        --budget-s $(( left - 40 )) --variants "X=1|NINFER_KW_TRY=1" > "$OUT/nv35.txt" 2>&1
      echo "35B nvfp4 rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^nvfp4|^skipped|ERROR" "$OUT/nv35.txt" | cut -c1-150
    fi
    ;;
  kwtry)
    # the 27B MTP round with TUNED_KW_TRY's K-walk candidates for the drafter's q8 layer and q4
    # shortlist head (NINFER_KW_TRY=1, written without a GPU) against as committed, then with
    # NINFER_GDN_REPLAY=1 too (~5 min); their GPU test first
    t0=$(date +%s)
    NINFER_KW_TRY=1 timeout 90 python3 -m pytest -q -rf -m gpu \
      "tests/plugins/quant_int/test_gemv_kw.py::test_gpu_35b_kw_entries_match_the_reference" > "$OUT/t.txt" 2>&1
    echo "KW_TRY GPU test rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"
    rounds $(( 330 - ($(date +%s) - t0) )) "X=1" "NINFER_KW_TRY=1" "X=1" "NINFER_KW_TRY=1" "NINFER_GDN_REPLAY=1 NINFER_KW_TRY=1"
    ;;
  mtp35)
    # the 35B-A3B's MTP round, never measured (~8.5 min): the MoE family's MTP GPU tests, then the
    # round (its MoE MTP layer drafting, the verify of 4 on the pair kernels), rounds/s and the
    # projected tok/s at the peer's published acceptance (labelled a projection: random weights
    # accept next to nothing), beside the plain step
    t0=$(date +%s)
    timeout 150 python3 -m pytest -v -rf -m gpu -n $NW tests/plugins/spec_mtp/test_spec_gpu.py -k moe > "$OUT/t.txt" 2>&1
    echo "MoE MTP GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(grep -c PASSED "$OUT/t.txt") passed"
    grep -E "FAILED|ERROR" "$OUT/t.txt" | cut -c1-200 | head -20
    timeout 400 python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k,int4_8k_mtp3 \
      --budget-s 330 > "$OUT/m35.txt" 2>&1
    echo "35B MTP rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "^int4_8k|spec round|projection|^skipped|ERROR|Error" "$OUT/m35.txt" | cut -c1-150
    ;;
  early2)
    # the 27B step with and without NINFER_GDN_EARLY / NINFER_KW_XREUSE, then the MTP round with the
    # K-walk's x pairs from the norms (its verify's K-walk launches at M = 4, the drafter's at M = 1)
    # against as committed (~9.5 min)
    t0=$(date +%s)
    steps qwen3.6-27b 250 190 e27.txt "27B step" "X=1" "NINFER_GDN_EARLY=1" "NINFER_KW_XREUSE=1" \
      "NINFER_GDN_EARLY=1 NINFER_KW_XREUSE=1" "X=1" "NINFER_GDN_EARLY=1 NINFER_KW_XREUSE=1"
    rounds $(( 570 - ($(date +%s) - t0) )) "X=1" "NINFER_KW_XREUSE=1" "X=1" "NINFER_KW_XREUSE=1"
    ;;
  tail2)
    # the eighteenth session's second call (~9.5 min): the GPU tests ring2's 120 s box cut (TKW, the
    # occupancy-sized decode attention, the K-walk's tail shares), bench/wave_tail.py, then the MTP
    # round as committed against NINFER_TKW_RING=0 (gate+up at M = 4 pinned, not the ring) and
    # NINFER_ATTN_OCCUPANCY=0 (the verify's attention at the old two-an-SM split count)
    t0=$(date +%s)
    timeout 210 python3 -m pytest -q -rf -m gpu -n $NW tests/plugins/quant_int/test_gemv_tkw.py \
      tests/core/kernels/test_triton_attention.py tests/plugins/quant_int/test_gemv_kw.py > "$OUT/t.txt" 2>&1
    echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    timeout 90 python3 bench/wave_tail.py --out "$OUT" > "$OUT/tail.txt" 2>&1
    echo "wave_tail rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-110 "$OUT/tail.txt"
    rounds $(( 585 - ($(date +%s) - t0) )) "X=1" "NINFER_TKW_RING=0" "NINFER_ATTN_OCCUPANCY=0" "X=1"
    ;;
  tail3)
    # the eighteenth session's last call (~9.8 min): GPU tests named one by one (-v: tail2's box cut
    # them with one failure unnamed), attention, the K-walk (tail shares now dispatched for gate+up
    # M = 1), the verify's grouped attention (spec_gpu, batched verify rows), TKW last; then the 27B
    # step as committed against NINFER_KW_TAIL=0 and NINFER_ATTN_WAVES=2, then the MTP round against
    # NINFER_ATTN_GROUPED=0 (each verify row its own query, as before)
    t0=$(date +%s)
    timeout 230 python3 -m pytest -v -rf -m gpu -n $NW tests/core/kernels/test_triton_attention.py \
      tests/plugins/quant_int/test_gemv_kw.py tests/plugins/spec_mtp/test_spec_gpu.py \
      "tests/plugins/spec_mtp/test_batched_rounds.py::test_verify_rows_match_decode_steps_and_commit_picks_the_column" \
      tests/plugins/quant_int/test_gemv_tkw.py > "$OUT/t.txt" 2>&1
    echo "GPU tests rc=$? $(( $(date +%s) - t0 )) s: $(grep -c PASSED "$OUT/t.txt") passed"
    grep -E "FAILED|ERROR" "$OUT/t.txt" | cut -c1-200 | head -20
    steps qwen3.6-27b 185 120 e27.txt "27B tail/waves A/B" "X=1" "NINFER_KW_TAIL=0" "NINFER_ATTN_WAVES=2" "X=1"
    rounds $(( 590 - ($(date +%s) - t0) )) "X=1" "NINFER_ATTN_GROUPED=0" "X=1"
    ;;
  ring3)
    # the ring at M = 1 in the real steps, before any table: every q4/q5 decode GEMV on the tensor-core
    # K-walk's default config moved to a 3-stage ring (mostly one wave: gemv_tkw.ring_waves) against
    # as committed, the 27B plain step then the MTP round; first, bench/wave_tail.py: does the K-walk's
    # part-full last wave cost a whole walk (gate+up at 4.12 waves, qkv+z at 2.59; ~1 min)? (~8 min)
    t0=$(date +%s)
    timeout 90 python3 bench/wave_tail.py --out "$OUT" > "$OUT/tail.txt" 2>&1
    echo "wave_tail rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/tail.txt" | cut -c1-110
    steps qwen3.6-27b 230 170 e27.txt "27B ring A/B" "X=1" "NINFER_TKW=1 NINFER_TKW_RING=3" "X=1" "NINFER_TKW=1 NINFER_TKW_RING=3"
    rounds $(( 560 - ($(date +%s) - t0) )) "X=1" "NINFER_TKW=1 NINFER_TKW_RING=3" "X=1" "NINFER_TKW=1 NINFER_TKW_RING=3"
    ;;
  go4)
    # the MTP round and the 35B step with the table, then the grouped MoE prefill (~9.5 min)
    t0=$(date +%s)
    rounds 170 "X=1" "NINFER_KW=0" "X=1" "NINFER_KW=0"
    steps qwen3.6-35b-a3b 200 150 e35.txt "35B table A/B" "X=1" "NINFER_KW=0" "NINFER_KW=1" "X=1"
    timeout 60 python3 -m pytest -q -rf -m gpu tests/plugins/moe_triton/test_moe_prefill_grouped.py > "$OUT/t.txt" 2>&1
    echo "grouped prefill tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    steps qwen3.6-35b-a3b $(( 585 - ($(date +%s) - t0) )) 120 p35.txt "35B prefill A/B" "X=1" "NINFER_MOE_PREFILL=grouped" "X=1" "NINFER_MOE_PREFILL=grouped"
    ;;
  go5)
    # weights asked of the L2 during the kernel before (NINFER_L2PF, prefetch.py, written without a
    # GPU): the GEMVs behind an idle stand-in kernel (bench/l2_ahead.py), then the 27B and 35B steps
    # with budgets of 16 and 32 MB against none, alternated (~9.5 min worst case)
    t0=$(date +%s)
    timeout 150 python3 bench/l2_ahead.py --out "$OUT" --idle-us 0,4 > "$OUT/l2.txt" 2>&1
    echo "l2_ahead rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-260 "$OUT/l2.txt"
    steps qwen3.6-27b 230 170 e27.txt "27B L2PF A/B" "X=1" "NINFER_L2PF=16" "NINFER_L2PF=32" "X=1" "NINFER_L2PF=16"
    steps qwen3.6-35b-a3b $(( 585 - ($(date +%s) - t0) )) 120 e35.txt "35B L2PF A/B" "X=1" "NINFER_L2PF=16" "NINFER_L2PF=32" "X=1"
    ;;
  go6)
    # where the steps' time goes now that the K-walk runs the 27B's big GEMVs: torch.profiler over the
    # CUDA-graph decode of the 27B and the 35B, kernels only, and the 27B MTP round (~8 min)
    t0=$(date +%s)
    P="python3 bench/profile_step.py --graph --quant int4 --gen-len 16"
    timeout 170 $P --model qwen3.6-27b --rows 30 --out "$OUT/p27" > "$OUT/p27.txt" 2>&1; echo "profile 27B rc=$? $(( $(date +%s) - t0 )) s"
    timeout 170 $P --model qwen3.6-35b-a3b --rows 40 --out "$OUT/p35" > "$OUT/p35.txt" 2>&1; echo "profile 35B rc=$? $(( $(date +%s) - t0 )) s"
    timeout $(( 585 - ($(date +%s) - t0) )) $P --model qwen3.6-27b --rows 30 --out "$OUT/pm" --spec mtp --draft-tokens 3 \
      --lm-head-draft > "$OUT/pm.txt" 2>&1; echo "profile MTP round rc=$? $(( $(date +%s) - t0 )) s"
    for f in p27 p35 pm; do echo "== $f"; head -32 "$OUT/$f.txt" | cut -c1-150; done
    ;;
  go1)
    # one call for a short lease: the K-walk and block GPU tests, kw_bench at M = 1 and 4, the block's
    # per-layer timings at T = 1 and 4 (each step time-boxed; ~9.5 min worst case)
    t0=$(date +%s)
    timeout 130 python3 -m pytest -q -rf -m gpu -n 4 tests/plugins/quant_int/test_gemv_kw.py \
      tests/plugins/moe_triton/test_moe_block.py > "$OUT/t.txt" 2>&1
    echo "kw + block tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head -20
    timeout 270 python3 bench/kw_bench.py --out "$OUT" > "$OUT/kw.txt" 2>&1
    echo "kw_bench rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-150 "$OUT/kw.txt"
    timeout $(( 580 - ($(date +%s) - t0) )) python3 bench/moe.py --out "$OUT/k" --no-tests --no-e2e --recipes int4 \
      --decode-t 1,4 --budget-s 100 > "$OUT/k.txt" 2>&1
    echo "block kernels rc=$? $(( $(date +%s) - t0 )) s"; grep -E "T= ?[14] |block" "$OUT/k.txt" | cut -c1-150
    ;;
  go2)
    # the decode step A/Bs in one call: the 35B with the block (and its folded norm) and NINFER_KW=1,
    # then the 27B with NINFER_KW=0 / as committed / NINFER_KW=1 (~9.5 min worst case)
    t0=$(date +%s)
    timeout 300 python3 bench/dense_27b.py --skip-tests --model qwen3.6-35b-a3b --only int4_8k --budget-s 240 \
      --variants "X=1|NINFER_MOE_BLOCK=1|NINFER_MOE_BLOCK=1 NINFER_MOE_BLOCK_NORM=1|NINFER_KW=1|NINFER_KW=1 NINFER_MOE_BLOCK=1 NINFER_MOE_BLOCK_NORM=1|X=1|NINFER_MOE_BLOCK=1 NINFER_MOE_BLOCK_NORM=1" \
      > "$OUT/e35.txt" 2>&1
    echo "35B step A/B rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^int4_8k|^skipped|ERROR" "$OUT/e35.txt" | cut -c1-150
    steps qwen3.6-27b $(( 580 - ($(date +%s) - t0) )) 200 e27.txt "27B KW A/B" "NINFER_KW=0" "X=1" "NINFER_KW=1" "NINFER_KW=0" "NINFER_KW=1"
    ;;
  ceiling)
    timeout 300 python3 bench/read_ceiling.py --out "$OUT" > "$OUT/ceiling.txt" 2>&1
    echo "read_ceiling rc=$?"; sed -n '/best per shape/,$p' "$OUT/ceiling.txt"
    ;;
  commit2)
    # NINFER_ROUND_IO=0 (the round's bookkeeping as torch ops again: spec_round's two kernels, 17
    # launches a round with the grouped sampling parameters, which stay), as committed, then the verify
    # split with 16 v rows and 2 warps without and with the conv inputs ahead (worst case 560 s)
    t0=$(date +%s)
    rounds 540 "NINFER_ROUND_IO=0" "X=1" "NINFER_GDN_VERIFY_BV=16:2" "NINFER_GDN_VERIFY_BV=16:2 NINFER_GDN_AHEAD=1" \
      "X=1" "NINFER_ROUND_IO=0"
    ;;
  second)
    # the tenth session's second call: the late trigger (now the default) on the plain step with every
    # q4/q5 GEMV direct (NINFER_TCD=1), with and without it; the round with TCD=1; then head4, shorter
    t0=$(date +%s)
    B="ninfer bench --model qwen3.6-27b --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
    for e in "X=1" "NINFER_TCD=1" "NINFER_TCD=1 NINFER_TC_LATE=0"; do
      env $e timeout 100 $B > "$OUT/b.txt" 2>&1; echo "27B plain, $e rc=$? $(( $(date +%s) - t0 )) s: $(grep -E '^ *decode' "$OUT/b.txt" | head -1 | cut -c1-120)"
    done
    # NINFER_TCD is read at model load (workspace): its own process
    NINFER_TCD=1 timeout 100 python3 bench/dense_27b.py --skip-tests --only int4_8k_mtp3_short > "$OUT/m.txt" 2>&1
    echo "MTP round, NINFER_TCD=1 rc=$?: $(grep -E 'spec round' "$OUT/m.txt" | cut -c1-140)"
    timeout 300 python3 bench/h2_tune.py --out "$OUT" --budget-s 240 --m4-all \
      --pairs "q6_g64:27b.lm_head,q8_g32:27b.mtp.qkv_merged,q8_g32:27b.mtp.fc" > "$OUT/tune.txt" 2>&1
    echo "tune rc=$? $(( $(date +%s) - t0 )) s"; tail -8 "$OUT/tune.txt"
    ;;
  head4)
    timeout 540 python3 bench/h2_tune.py --out "$OUT" --budget-s 480 --m4-all \
      --pairs "q6_g64:27b.lm_head,q8_g32:27b.mtp.qkv_merged,q8_g32:27b.mtp.fc" > "$OUT/tune.txt" 2>&1
    echo "tune rc=$?"; tail -8 "$OUT/tune.txt"
    ;;
  late)
    t0=$(date +%s)
    timeout 120 python3 -m pytest -q -rf -m gpu tests/plugins/quant_int/test_gemv_tc.py -k direct_graph_replay > "$OUT/t.txt" 2>&1
    echo "tests rc=$?"; tail -1 "$OUT/t.txt"; grep -E "^(FAILED|ERROR)" "$OUT/t.txt" | head
    B="ninfer bench --model qwen3.6-27b --random-weights --quant int4 --prompt-len 8192 --gen-len 64"
    for e in "X=1" "NINFER_TCD=1" "NINFER_TCD=1 NINFER_TC_LATE=1"; do
      env $e timeout 100 $B > "$OUT/b.txt" 2>&1; echo "27B plain, $e rc=$?: $(grep -E '^ *decode' "$OUT/b.txt" | head -1 | cut -c1-120)"
    done
    timeout 60 python3 -m pytest -q -rf -m gpu tests/core/kernels/test_triton_gdn.py > "$OUT/t2.txt" 2>&1
    echo "gdn tests rc=$?"; tail -1 "$OUT/t2.txt"
    timeout 90 python3 bench/gdn_columns.py --variants 128:4,32:4,32:4:n,16:2:n > "$OUT/gdn.txt" 2>&1
    echo "gdn_columns rc=$?"; grep -E "columns|MISMATCH" "$OUT/gdn.txt"
    rounds 100 "X=1" "NINFER_TC_LATE=1" "NINFER_GDN_SPLIT_NORM=1"
    ;;
  *)
    echo "usage: bash bench/next_session.sh auto|s33|s33h|tests|tests-a|tests-b|folds|dense|round|profile|tune|kernels|tcd|ahead|late|first|second|head4|commit|commit2|tail [27b|35b]|ceiling" >&2
    exit 2
    ;;
esac
pack_triton_cache
