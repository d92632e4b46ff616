"""The reference implementations: plain torch, run anywhere, the oracle for every tuned kernel.

Registered like any third-party plugin; tuned plugins win over these with `tryfirst=True` where
their requirements hold.
"""

from __future__ import annotations

from ninfer import hookimpl
from ninfer.linear import DENSE, DenseKernel


@hookimpl
def ninfer_linear_kernel(scheme, device, n, k):
    return DenseKernel() if scheme == DENSE else None


@hookimpl
def ninfer_sampler(device):
    from ninfer.kernels.sampling import ReferenceSampler

    return ReferenceSampler()
