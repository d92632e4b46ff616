"""Build the CUDA GEMV library (quant_int/gemv_cu.cu) here for a lent GPU's architecture, into .tcache/
under the name its cache looks for, so a cold device call loads it instead of running nvcc there
(72 s on the lent H100, 2026-12-07; 33 s here). The name (gemv_cu.library_name) covers the source, the architecture
and `nvcc --version`: this machine's nvcc (13.0.88) is the lent machines' (their tag matched), and a
library whose tag differs there is simply not found and built again.

    python3 bench/prebuild_cu.py [--arch 90] [--out .tcache]

bench/device_env.sh copies .tcache/gemv_cu_sm*.so into the cache (NINFER_CACHE or ~/.cache/ninfer)/cuda/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="90")
    ap.add_argument("--out", default=".tcache")
    args = ap.parse_args()
    from ninfer_plugins.quant_int import gemv_cu as CU

    nvcc = CU._nvcc()
    if nvcc is None:
        print("prebuild_cu: no nvcc here")
        return 2
    out = Path(args.out) / CU.library_name(args.arch)
    for old in Path(args.out).glob(f"gemv_cu_sm{args.arch}_*.so"):
        if old != out:
            old.unlink()  # a stale source's library: one a call is enough to carry
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(CU.nvcc_command(args.arch, out), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-2000:])
            return 1
    print(f"{out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
