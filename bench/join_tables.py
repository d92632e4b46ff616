"""Join a cu_gemv_bench run's tables, <dir>/tuned_cu.py (plain winners) and tuned_cu_words.py (q5 on its
prepared words, keyed 21), into <dir>/tuned_all.py, one table for NINFER_CU_TUNED; prints it.

    python3 bench/join_tables.py DIR
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def main() -> int:
    out = Path(sys.argv[1])
    table = {}
    for name in ("tuned_cu.py", "tuned_cu_words.py"):  # keys apart: words winners are keyed 21
        f = out / name
        if f.exists():
            table.update(ast.literal_eval(f.read_text().split("=", 1)[1].strip()))
    (out / "tuned_all.py").write_text("TUNED_CU = " + repr(table) + "\n")
    print("tuned_all:", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
