# Sourced by the device-call scripts (bench/next_session.sh, bench/calls/*.sh), run from the repository
# root on the lent GPU with `.whl` carried: the carried wheels on PYTHONPATH, this tree installed in
# editable mode, unbuffered output, and $OUT (the folder whose files come back) made.
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
# cache in $OUT/0_triton.tgz (named to sort first among the 8 files a call brings back); copy it
# to .tcache/ here (`cp /work/.device/N/0_triton.tgz .tcache/`) and carry [".whl", ".tcache"].
# The keys hold the source, the Triton version and the target, so a stale entry is never used.
export TRITON_CACHE_DIR=/tmp/tcache
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .tcache/0_triton.tgz ]; then
  tar xzf .tcache/0_triton.tgz -C "$TRITON_CACHE_DIR" 2>/dev/null \
    && echo "triton cache: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) kernels from .tcache"
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
  [ "$(stat -c %s "$f")" -gt 16000000 ] && rm -f "$f" && echo "triton cache over 16 MB: not brought back"
  return 0
}
