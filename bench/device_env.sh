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
