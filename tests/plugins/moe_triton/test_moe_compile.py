"""Every MoE kernel variant compiles for sm_90 (H200) here, without a GPU (compile_sm90.py):
what the interpreted tests cannot see. Slow (a minute or two of compiling the first time, on two
cores; Triton's cache makes later runs seconds); needs Triton's NVIDIA backend and its ptxas."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _nvidia_backend() -> bool:
    # found without importing triton: an import here, at collection, would come before the
    # other test modules set TRITON_INTERPRET=1 and leave their kernels half interpreted
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    return (Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "compiler.py").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not _nvidia_backend(), reason="Triton without its NVIDIA backend")
def test_every_moe_kernel_compiles_for_sm90():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, str(HERE / "compile_sm90.py")], env=env, capture_output=True, text=True, timeout=900)
    failures = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and not failures, "\n".join(failures) or proc.stderr[-3000:]
