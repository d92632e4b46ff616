# Thirty-third session's first H200 call (~9.5 min warm): the one-token bf16 GEMV (GPU tests,
# microbench, the 27B bf16 step alternated; bench/calls/dense_gemv.sh), then s33h.sh's MTP round with
# the MTP layer's projections merged against NINFER_MTP_FUSE=0 (its GPU tests skipped); the Triton
# cache last.
DG_S=${DG_S:-300} bash bench/calls/dense_gemv.sh
S33_TESTS=0 S33_M=${S33_M:-230} bash bench/calls/s33h.sh
