"""What kernels prepared from an input, kept for reuse: when to forget it.

A kernel may note that a scratch buffer holds what it made from an input tensor, so that a later
launch on the same tensor skips making it again (quant_int's K-walk x pairs, gemv_kw.note_input).
The host sees only the launches it issues: a CUDA-graph replay, or a capture (whose launches do
not run then), changes such scratch behind its back. So every note carries the epoch it was made
in, and the epoch moves at each capture's start and end, after each replay, and at the start of
each pass over a layer stack. No Triton here: the graph runner imports it.
"""

from __future__ import annotations

_epoch = 0


def new_epoch() -> None:
    """Forget every input a kernel noted as prepared."""
    global _epoch
    _epoch += 1


def epoch() -> int:
    return _epoch
