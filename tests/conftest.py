"""Set before anything imports triton: without CUDA our kernels run under Triton's interpreter.

`ninfer.kernels.triton` sets TRITON_INTERPRET=1 itself when torch sees no CUDA, but triton reads
the variable when its own modules are imported (its `tl.sum` and friends are decorated then). A
test that first imports triton by another route (transformers, or torch during training) would
otherwise leave those helpers compiled-only and the interpreted kernels failing later in the same
process ("Cannot call @triton.jit'd outside of the scope of a kernel")."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("NINFER_TEST_PLAIN_INTERPRETER") != "1":
    # the interpreter without its per-helper-call re-patching (tests/interp_fast.py says why it
    # changes nothing); NINFER_TEST_PLAIN_INTERPRETER=1 runs Triton's own, to compare
    from interp_fast import install

    install()
