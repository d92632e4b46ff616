"""Set before anything imports triton: without CUDA our kernels run under Triton's interpreter.

`ninfer.kernels.triton` sets TRITON_INTERPRET=1 itself when torch sees no CUDA, but triton reads
the variable when its own modules are imported (its `tl.sum` and friends are decorated then). A
test that first imports triton by another route (transformers, or torch during training) would
otherwise leave those helpers compiled-only and the interpreted kernels failing later in the same
process ("Cannot call @triton.jit'd outside of the scope of a kernel")."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("NINFER_TEST_PLAIN_INTERPRETER") != "1":
    # the interpreter without its per-helper-call re-patching (tests/interp_fast.py says why it
    # changes nothing); NINFER_TEST_PLAIN_INTERPRETER=1 runs Triton's own, to compare
    from interp_fast import install

    install()


@pytest.fixture(autouse=True)
def _no_card_table(request, monkeypatch):
    """Tests not marked gpu see the CUDA GEMV's shared table only (NINFER_CU_CARD=0), not the
    per-card winners (tuned.TUNED_CU_CARD) of whatever card the machine has: the CPU tests of the
    dispatch must pick the same kernels on a GPU machine as in CI. A test that sets the switch, or
    a run that set it, keeps its value."""
    if request.node.get_closest_marker("gpu") is None and "NINFER_CU_CARD" not in os.environ:
        monkeypatch.setenv("NINFER_CU_CARD", "0")
