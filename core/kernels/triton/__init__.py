"""Generic Triton kernels for decode, and the small fused ops prefill shares.

Each kernel has a torch oracle in `ninfer.kernels.reference`; tests compare the two on fresh
random inputs. Without CUDA the kernels still run under `TRITON_INTERPRET=1` (slowly), which is
how CI checks them (importing this package sets TRITON_INTERPRET=1 when torch sees no CUDA).
Signatures and layouts are documented on each function.
"""

import os

import torch

# Without CUDA these kernels can only run interpreted. Triton decides that when a kernel is
# decorated (at import), so it is set here, before the kernel modules load, whatever imported
# this package first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ninfer.kernels.triton.attention import decode_attention, default_num_splits  # noqa: E402
from ninfer.kernels.triton.gdn import commit_columns, commit_replay, gdn_decode_step, gdn_prefill_conv, gdn_verify_columns  # noqa: E402
from ninfer.kernels.triton.norms import gated_rmsnorm, rmsnorm, sigmoid_gate, swiglu  # noqa: E402
from ninfer.kernels.triton.rope import append_kv, qk_norm_rope, qk_norm_rope_append  # noqa: E402

__all__ = [
    "append_kv",
    "commit_columns",
    "commit_replay",
    "decode_attention",
    "default_num_splits",
    "gated_rmsnorm",
    "gdn_decode_step",
    "gdn_prefill_conv",
    "gdn_verify_columns",
    "qk_norm_rope",
    "qk_norm_rope_append",
    "rmsnorm",
    "sigmoid_gate",
    "swiglu",
]
