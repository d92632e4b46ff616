"""Static SASS count of the CUDA GEMV's main loop (quant_int/gemv_cu.cu), per instantiation.

    python3 bench/cu_sass.py [--arch 90] [--cuobjdump PATH]

Builds the library as the engine does (gemv_cu.nvcc_command) for sm_<arch>, disassembles it (cuobjdump on PATH, or the one Triton's
wheel carries: triton/backends/nvidia/bin/cuobjdump), finds each kernel's longest backward branch
(the K loop) and prints its instructions per weight and its most frequent opcodes, for the
CUDA-core form (gemv) and the tensor-core form (gemv_mma, a lane's weights a trip). No GPU needed.
The issue budget to compare with (BENCHMARKS.md, fourteenth run): an H200 issues ~33.4 T
thread-instructions a second, so at 100% of copy q4 may spend ~4.3 instructions a weight, q5 ~5.3.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ninfer_plugins.quant_int.gemv_cu import nvcc_command


def _cuobjdump(given: str | None) -> str:
    if given:
        return given
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if cand.is_file():
            return str(cand)
    except ImportError:
        pass
    sys.exit("cu_sass: no cuobjdump (on PATH or in Triton's wheel); give --cuobjdump")


def _addr(line: str) -> int:
    return int(re.match(r"\s+/\*([0-9a-f]{4,})\*/", line).group(1), 16)


def loops(sass: str) -> list[tuple[tuple[str, tuple[int, ...]], int, dict]]:
    """Per instantiation: ((kernel, template arguments), loop instructions, opcode counts), kernel
    "gemv" (<BITS, M, R, U, KS, PF>) or "gemv_mma" (<BITS, U, KS, PF, OFS, KC>)."""
    out = []
    for f in re.split(r"\n\s+Function : ", sass)[1:]:
        m = re.search(r"(gemv|gemv_mma)I((?:Li\d+E)+)E", f.split("\n", 1)[0])
        if not m:
            continue
        args = tuple(int(a) for a in re.findall(r"Li(\d+)E", m.group(2)))
        lines = [ln for ln in f.split("\n") if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
        best = None
        for i, ln in enumerate(lines):
            b = re.search(r"\bBRA\b[^;]*?0x([0-9a-f]+)", ln)
            if b and int(b.group(1), 16) < _addr(ln):
                span = _addr(ln) - int(b.group(1), 16)
                if best is None or span > best[0]:
                    best = (span, i, int(b.group(1), 16))
        if best is None:
            continue
        _, i, target = best
        j = next(k for k, ln in enumerate(lines) if _addr(ln) == target)
        ops: dict[str, int] = {}
        for ln in lines[j : i + 1]:
            t = ln.split("*/", 1)[1].split()
            op = (t[1] if t[0].startswith("@") else t[0]).split(".")[0].rstrip(";")
            ops[op] = ops.get(op, 0) + 1
        out.append(((m.group(1), args), i - j + 1, ops))
    return sorted(out)


def _fmt(bits: int) -> str:
    # 21: q5 reading its high bits as prepared words (gemv_cu.q5_words)
    return {16: "nvfp4", 21: "q5w"}.get(bits, f"q{bits}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="90")
    ap.add_argument("--cuobjdump", default=None)
    args = ap.parse_args()
    tool = _cuobjdump(args.cuobjdump)
    with tempfile.TemporaryDirectory() as d:
        so = Path(d) / "g.so"
        subprocess.run(nvcc_command(args.arch, so), check=True)
        sass = subprocess.run([tool, "-sass", str(so)], check=True, capture_output=True, text=True).stdout
    for (kernel, args), n, ops in loops(sass):
        top = " ".join(f"{k}:{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
        if kernel == "gemv_mma":
            # a trip: U K blocks of two rows' 16-byte vectors a lane, 64 U weights, at any M <= 4
            bits, u, ks, pf, ofs, kc = (*args, 0, 0, 1)[:6]
            name = f"mma {_fmt(bits)} U{u} KS{ks}" + (f" KC{kc}" if kc > 1 else "") + (" PF" if pf else "") + (" OFS" if ofs else "")
            weights = 64 * u * (2 if pf else 1)
        else:
            bits, m, r, u, ks, pf = args if len(args) == 6 else (*args, 0)
            # codes a 16-byte vector; the pipelined walk's loop is two trips (its two register sets)
            weights = (16 if bits == 8 else 32) * r * u * (2 if pf else 1)
            name = f"{_fmt(bits)} M{m} R{r} U{u} KS{ks}" + (" PF" if pf else "")
        print(f"{name}: {n} / {weights} weights = {n / weights:.2f}   {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
