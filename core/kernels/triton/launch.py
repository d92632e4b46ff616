"""What every kernel wrapper asks of the device before it launches."""

from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU CI). Triton 3.9's interpreter multiplies bf16 tl.dot
    operands as their raw 16-bit integers, so kernels upcast dot operands to fp32 there."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.lru_cache(maxsize=None)
def sm_count(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return 4
