"""One layer of the 27B's GDN verify (replay form, the round's default config) and decode step,
a few launches each, for Nsight Compute to read one of them:

    ncu --set full -k regex:_gdn_columns_kernel -s 3 -c 1 python3 bench/gdn_ncu.py

(`bench/next_session.sh gdnncu` runs it and prints the sections that say what the kernel waits on.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gdn_columns import columns, decode, layer  # noqa: E402

if __name__ == "__main__":
    L = layer(4)
    for _ in range(5):
        columns(L, 4, 32, 4, paired=True, replay=True)
        decode(L, None, None, paired=True)
    torch.cuda.synchronize()
    print("done")
