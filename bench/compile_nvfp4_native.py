"""Compile the W4A4 activation quantizer (quant_nvfp4/act_kernel.py) for sm_100, sm_120 and
sm_90 on a machine without a GPU, and print its registers and spills.

    /tmp/t36/bin/python bench/compile_nvfp4_native.py

It runs only on FP4 tensor cores (sm_100+), which this project has never been lent; this shows
that the kernel the interpreter tests also compiles for them. Uses skinny_sass.py's compile-only
driver, pointed at each target in turn. Exit status 1 when a target fails.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skinny_sass as S  # noqa: E402

S.install()

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from ninfer_plugins.quant_nvfp4 import native as N  # noqa: E402


def main() -> int:
    failed = 0
    for arch in (100, 120, 90):
        S._CompileOnlyDriver.get_current_target = lambda self, a=arch: GPUTarget("cuda", a, 32)
        for m, k, static in ((1, 5120, False), (8192, 5120, False), (4, 2048, True)):
            S._compiled.clear()
            try:
                x = torch.empty(m, k, dtype=torch.bfloat16)
                N.quantize_activations(x, -(-k // 64) * 64, torch.ones(1) if static else None)
                kern = S._compiled[-1]
                regs, local, _ = S.resources(kern)
                print(f"sm_{arch} M={m} K={k} static={static}: ok, {regs} registers, local {local} bytes, "
                      f"{kern.metadata.num_warps} warps")
            except Exception:
                failed += 1
                print(f"sm_{arch} M={m} K={k}: FAILED")
                traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
