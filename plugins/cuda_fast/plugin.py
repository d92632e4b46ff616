"""The dense GPU fast path: attention backends that run whole mixer steps in few launches.

Hookimpls: `ninfer_attention_backend` (tryfirst) answers for both kinds the qwen_hybrid layers
ask for, on CUDA sm_80+ with Triton:

* "full": `FlashFullAttention` (attention.py): the fused q/k (1+w) norm + partial RoPE + KV append
  (bf16 or INT8-G64), then decode through the split-K Triton kernel with the sigmoid gate in its
  merge, prefill through flash attention (torch SDPA) over the chunk and the cached prefix. It
  also carries `ops` (ops.py): Triton RMSNorm with the residual add fused, SwiGLU, for the layers.
* "linear": `TritonLinearAttention` (gdn.py): chunked prefill through fla-core's
  `chunk_gated_delta_rule` when importable (else the torch chunked form), decode through the
  fused Triton step (conv, L2 norms, gates, state update in place, gated RMSNorm).

* the sampler: `TritonSampler` (sampler.py), the reference sampler whose captured-step pipeline
  (`sample_rows`) is two fused Triton launches.
* the `bf16` linears: `DenseGemvKernel` (dense_gemv.py), F.linear, or at one token a Triton GEMV
  that takes SwiGLU into the down projection (behind NINFER_DENSE_GEMV).

Elsewhere (CPU, older GPUs) startup passes these over and the reference backends serve. The
kernels live in `ninfer.kernels.triton` (generic) and here (the few that are this path's own).
"""

from __future__ import annotations

from ninfer import hookimpl
from ninfer.device import Requirements

# Triton's bf16 tl.dot and the kernels' 16-byte loads need Ampere or later.
GPU = Requirements(devices=("cuda",), min_capability=(8, 0), features=("triton",))


@hookimpl(tryfirst=True)
def ninfer_attention_backend(kind, device, kv_dtype, head_dim):
    if kind == "full":
        # the split-K kernel: head_dim a multiple of the INT8 group (64), at most 4 groups
        if kv_dtype not in ("bf16", "int8") or head_dim % 64 or head_dim > 256:
            return None
        from ninfer_plugins.cuda_fast.attention import FlashFullAttention

        return FlashFullAttention()
    if kind == "linear":
        if head_dim < 16 or head_dim & (head_dim - 1):  # tl.arange needs a power of two
            return None
        from ninfer_plugins.cuda_fast.gdn import TritonLinearAttention

        return TritonLinearAttention()
    return None


@hookimpl(tryfirst=True)
def ninfer_linear_kernel(scheme, device, n, k):
    # bf16 weights: F.linear, with the one-token GEMV of dense_gemv.py behind NINFER_DENSE_GEMV
    from ninfer.linear import DENSE

    if scheme != DENSE:
        return None
    from ninfer_plugins.cuda_fast.dense_gemv import DenseGemvKernel

    return DenseGemvKernel()


@hookimpl(tryfirst=True)
def ninfer_sampler(device):
    from ninfer_plugins.cuda_fast.sampler import TritonSampler

    return TritonSampler()
