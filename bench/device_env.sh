# Sourced by the device-call scripts (bench/next_session.sh, bench/calls/*.sh), run from the repository
# root on the lent GPU with `.whl` carried: the carried wheels on PYTHONPATH, this tree installed in
# editable mode, unbuffered output, and $OUT (the folder whose files come back) made.
# A GPU process alive as a call starts is left over from an earlier call on this warm machine (calls
# run one at a time): the twenty-fifth session's bars call found a python3 holding 65 GiB of the
# H100 and the 27B bf16 run was refused for want of memory. Name and end it.
LEFT=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null)
if [ -n "$LEFT" ]; then
  echo "GPU processes left by an earlier call (ended now): $LEFT"
  for pid in $(cut -d, -f1 <<< "$LEFT"); do kill -9 "$pid" 2>/dev/null; done
  sleep 3
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_1 .whl/*.whl \
  && export PYTHONPATH=/tmp/site_1 || exit 1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
# pytest-xdist workers for the GPU suite: four on an H200 (141 GB); three on an 80 GB H100, where
# eight ran 45 of quant_int's tests out of memory (2026-12-05)
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
NW=4
[ "${GPU_MIB:-0}" -lt 100000 ] && NW=3
export NW
# Triton's compiled kernels across calls: each call that finds a released machine starts cold, and
# compiling is most of a cold call's first minutes (over 2.5 min before the 27B bench's first
# timing, twenty-third session). `pack_triton_cache` (next_session.sh calls it last) leaves the
# cache in $OUT/0_triton.tgz (named to sort first among the 8 files a call brings back), or past
# 15 MB (a call brings back 16 MiB a file) in two pieces 0_triton.tgz.0 and .1; copy them to
# .tcache/ here (`rm -f .tcache/*; cp /work/.device/N/0_triton.tgz* .tcache/`) and carry
# [".whl", ".tcache"] (the .whl wheels are 18 MB of the 64 MiB a call may carry).
# The keys hold the source, the Triton version and the target, so a stale entry is never used.
export TRITON_CACHE_DIR=/tmp/tcache
mkdir -p "$TRITON_CACHE_DIR"
if ls .tcache/0_triton.tgz* > /dev/null 2>&1; then
  # one file, or the pieces of one (their names sort in order)
  cat .tcache/0_triton.tgz* | tar xz -C "$TRITON_CACHE_DIR" 2>/dev/null \
    && echo "triton cache: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) kernels from .tcache"
fi

# the CUDA GEMV's library built on the workstation (bench/prebuild_cu.py: same nvcc, so the same cache
# name), carried in .tcache: a cold call loads it instead of spending ~72 s in nvcc
if ls .tcache/gemv_cu_sm*.so > /dev/null 2>&1; then
  CU_CACHE="${NINFER_CACHE:-$HOME/.cache/ninfer}/cuda"
  mkdir -p "$CU_CACHE" && cp .tcache/gemv_cu_sm*.so "$CU_CACHE/" && echo "CUDA GEMV library from .tcache: $(ls .tcache/gemv_cu_sm*.so)"
fi

pack_triton_cache() {
  [ "${TCACHE_PACK:-1}" = "0" ] && return 0
  local f="$OUT/0_triton.tgz"
  tar czf "$f" -C "$TRITON_CACHE_DIR" . 2>/dev/null
  if [ "$(stat -c %s "$f")" -gt 16000000 ]; then
    # the intermediate forms are not needed to load a kernel: the cubin and its metadata are
    tar czf "$f" -C "$TRITON_CACHE_DIR" --exclude='*.ptx' --exclude='*.ttir' --exclude='*.ttgir' \
      --exclude='*.llir' --exclude='*.source' --exclude='*.amdgcn' . 2>/dev/null
  fi
  echo "triton cache: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) kernels, $(( $(stat -c %s "$f") / 1048576 )) MiB packed"
  if [ "$(stat -c %s "$f")" -gt 30000000 ]; then
    rm -f "$f"; echo "triton cache over 30 MB: not brought back"
  elif [ "$(stat -c %s "$f")" -gt 15000000 ]; then
    # two pieces under a file's 16 MiB (they take two of the 8 files a call brings back)
    split -b 15000000 -d -a 1 "$f" "$f." && rm -f "$f" && echo "triton cache in two pieces: $f.0, $f.1"
  fi
  return 0
}
