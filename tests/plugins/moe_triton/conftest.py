"""A time budget for the GPU campaign (bench/moe.py): past NINFER_TEST_DEADLINE (Unix seconds)
every test not yet started is skipped, so pytest still ends on its own and prints its summary
(a subprocess killed by a timeout would print none). Unset: no budget.

Also decides TRITON_INTERPRET before any test module is collected: test_moe_core imports the
kernels at collection, and a kernel module imported before the switch stays compiled-only
(every interpreted test of this directory then failed when it ran alone, not after tests/core)."""

from __future__ import annotations

import os
import time

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_runtest_setup(item):
    deadline = float(os.environ.get("NINFER_TEST_DEADLINE") or 0)
    if deadline and time.time() > deadline:
        pytest.skip("out of the campaign's time budget (NINFER_TEST_DEADLINE)")
