"""Static SASS of the q4 decode kernels for sm_90, compiled on a machine without a GPU.

    python bench/skinny_sass.py [--n 17408 --k 5120] [--dump DIR]

Compiles quant_int/skinny.py's kernel (a few configs) and kernels.py's `_qmm_kernel` (its M = 1
configs) for sm_90 with whatever Triton is installed (the H200 runs Triton 3.6: use a 3.6 venv,
codegen differs between versions), by swapping Triton's driver for one that answers "CUDA, sm_90"
and making each launch compile without running (tests/plugins/moe_triton/compile_sm90.py's
trick). The cubin is read with Triton's bundled nvdisasm / cuobjdump. Per variant: registers,
shared memory, local memory (spills), and for the main loop (the backward branch whose body holds
the MMAs): SASS instructions per trip, per weight of one thread, and counts by opcode family.

Budget (BENCHMARKS.md): streaming q4 at the H200's copy bandwidth leaves an SM ~33 weights a
cycle, about 3.9 thread-instructions per weight at perfect issue.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.runtime.jit as jit  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
FAMILIES = ("LDS", "STS", "LDSM", "BAR", "HGMMA", "HMMA", "LOP3", "PRMT", "SHF", "HFMA2", "FFMA", "IMAD", "LDG", "LDGSTS")


class _CompileOnlyDriver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


_compiled: list = []
# the grid each compiled kernel was launched with (a tuple, or None where it was a function), in
# _compiled's order: bench/occupancy.py's waves
_grids: list = []


def install() -> None:
    driver.set_active(_CompileOnlyDriver())
    original = jit.JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        _compiled.append(kernel)
        _grids.append(tuple(grid) if isinstance(grid, (tuple, list)) else None)
        return kernel

    jit.JITFunction.run = compile_only


@dataclass
class Stats:
    name: str
    regs: int
    smem: int
    local: int
    loop: int
    weights: int
    counts: dict[str, int]


def _run(tool: str, *args: str) -> str:
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, check=True).stdout


def _opcode(text: str) -> str:
    if text.startswith("@"):
        text = text.split(None, 1)[1]
    return text.split()[0]


def main_loop(sass: str) -> list[str]:
    """Opcodes of the loop body holding the most MMA instructions, else the most f16x2 FMAs, else
    the first loop (label .. backward branch)."""
    labels: dict[str, int] = {}
    ins: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in sass.splitlines():
        m = re.match(r"^\s*(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
        if m:
            addr = int(m.group(1), 16)
            for lab in pending:
                labels[lab] = addr
            pending = []
            ins.append((addr, m.group(2)))
    def rank(body: list[str]) -> tuple[int, int]:
        # the MMAs first; without any, the loop holding the most f16x2 FMAs (the decode GEMVs'
        # dot: a kernel's other loops, such as gemv_kw's inline x pairs, have none)
        return (sum(o.startswith(("HGMMA", "HMMA")) for o in body), sum(o.startswith("HFMA2") for o in body))

    best: list[str] = []
    for addr, text in ins:
        m = re.search(r"BRA\s.*?(\.L_x_\d+)", text)
        if m and labels.get(m.group(1), addr + 1) <= addr:
            body = [_opcode(t) for a, t in ins if labels[m.group(1)] <= a <= addr]
            if not best or rank(body) > rank(best):
                best = body
    return best


def resources(kernel) -> tuple[int, int, int]:
    """(registers a thread, local + stack bytes a thread, shared bytes) of a compiled kernel."""
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        res = _run("cuobjdump", "-res-usage", str(cubin))
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    local = int(re.search(r"LOCAL:(\d+)", res).group(1)) + int(re.search(r"STACK:(\d+)", res).group(1))
    return regs, local, kernel.metadata.shared


def analyse(name: str, kernel, weights_per_thread: int, dump: Path | None) -> Stats:
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = _run("nvdisasm", "-c", str(cubin))
        res = _run("cuobjdump", "-res-usage", str(cubin))
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9]+", "_", name)
        (dump / f"{stem}.sass").write_text(sass)
        (dump / f"{stem}.ttgir").write_text(kernel.asm["ttgir"])
        (dump / f"{stem}.ptx").write_text(kernel.asm["ptx"])
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    local = int(re.search(r"LOCAL:(\d+)", res).group(1)) + int(re.search(r"STACK:(\d+)", res).group(1))
    body = main_loop(sass)
    fam = collections.Counter(o.split(".")[0] for o in body)
    counts = {f: fam.get(f, 0) for f in FAMILIES}
    counts["LDSM"] = sum(o.startswith("LDSM") for o in body)
    counts["LDS"] = sum(o.split(".")[0] == "LDS" for o in body)
    return Stats(name, regs, kernel.metadata.shared, local, len(body), weights_per_thread, counts)


def sweep(launch, cfgs, formats, ms, n: int, k: int, weights_per_thread, dump: Path | None, smem: bool = False) -> int:
    """Compile launch(x [m, k], prepared q<fmt> weight [n, k], cfg) for every format, M and
    config (each cfg with `describe()`) and print a row per variant: registers, shared bytes
    (with `smem`), spilled bytes, the main loop's instructions, weights_per_thread(cfg) and
    instructions a weight, the top opcodes. Returns the number of variants that failed."""
    import traceback

    fails = 0
    print(f"{'variant':42s} {'regs':>5s}" + (f" {'smem':>6s}" if smem else "")
          + f" {'local':>5s} {'loop':>5s} {'w/thr':>6s} {'ins/w':>6s}  top opcodes")
    for fmt in formats:
        p = empty_prepared(fmt, n, k)
        for m in ms:
            for cfg in cfgs:
                name = f"q{fmt} M={m} {cfg.describe()}"
                _compiled.clear()
                try:
                    launch(torch.empty(m, k, dtype=torch.bfloat16), p, cfg)
                    kern = _compiled[-1]
                except Exception:  # noqa: BLE001 - report every failure, then go on
                    fails += 1
                    print(f"FAIL {name}\n{traceback.format_exc()[-3000:]}", flush=True)
                    continue
                wpt = weights_per_thread(cfg)
                st = analyse(name, kern, wpt, dump)
                top = sorted(((v, f) for f, v in st.counts.items() if v), reverse=True)[:8]
                print(f"{name:42s} {st.regs:5d}" + (f" {st.smem:6d}" if smem else "")
                      + f" {st.local:5d} {st.loop:5d} {wpt:6d} {st.loop / wpt:6.2f}  "
                      + " ".join(f"{f}:{v}" for v, f in top), flush=True)
    return fails


def empty_prepared(fmt: int, n: int, k: int):
    """A kernels.Prepared weight of never-read tensors in the shapes of format `fmt` (a q4/q5/q6/q8
    id, or NVFP4's 16), for compile-only launches."""
    from ninfer_plugins.quant_int import kernels as K

    e = torch.empty
    if fmt == K.NVFP4:
        # codes two a byte, one E4M3 byte a group of 16, a per-row fp32 global scale (prepare_nvfp4)
        return K.Prepared(fmt=fmt, n=n, k=k, qweight=e(n, k // 2, dtype=torch.uint8),
                          scales=e(n, k // 16, dtype=torch.uint8), gscale=e(n, dtype=torch.float32))
    return K.Prepared(fmt=fmt, n=n, k=k, qweight=e(n, k if fmt == 8 else k // 2, dtype=torch.uint8),
                      scales=e(n, (4 if fmt == 8 else 2) * k // 128, dtype=torch.float16),
                      qhigh=e(n, (fmt - 4) * k // 8, dtype=torch.uint8) if fmt in (5, 6) else None)


def variants(n: int, k: int):
    from ninfer_plugins.quant_int import kernels as K
    from ninfer_plugins.quant_int import skinny as SK

    rows = -(-n // K.ROW_PAD) * K.ROW_PAD
    p = K.Prepared(K.Q4, n, k, torch.empty(rows, k // 2, dtype=torch.uint8), torch.empty(rows, k // 64, dtype=torch.float16))
    x = torch.empty(1, k, dtype=torch.bfloat16)
    for cfg in (SK.SkinnyConfig(64, 2, 4, 3), SK.SkinnyConfig(128, 2, 4, 3), SK.SkinnyConfig(128, 2, 8, 3),
                SK.SkinnyConfig(256, 2, 8, 3)):  # fmt: skip
        yield f"skinny {cfg.describe()[7:]}", (lambda c=cfg: SK.launch(x, p, c)), cfg.block_n * 128 // (32 * cfg.num_warps)
    # its M = 1 winners (tuned.py: 3 or 4 stages), and BLOCK_N 128 for a like-for-like tile
    for cfg in (K.Config(64, 16, 2, 4, 3, 1, False, 1), K.Config(64, 16, 2, 4, 4, 1, False, 1), K.Config(128, 16, 2, 4, 3, 1, False, 1)):
        yield f"_qmm_kernel {cfg.describe()}", (lambda c=cfg: K.launch(x, p, c)), cfg.block_n * 128 * cfg.kb_step // (32 * cfg.num_warps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=17408)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--dump", type=Path, default=None, help="write each variant's SASS, TTGIR and PTX here")
    args = ap.parse_args()
    install()
    print(f"Triton {triton.__version__}, sm_90, q4 {args.n}x{args.k}, M = 1" + ("" if triton.__version__.startswith("3.6") else
          "  (the H200 runs Triton 3.6: these counts may differ there)"))  # fmt: skip
    head = f"{'variant':44s} {'regs':>4s} {'smem':>6s} {'spill':>5s} {'loop':>5s} {'w/thr':>5s} {'/w':>5s}"
    print(head + "".join(f" {f:>6s}" for f in FAMILIES))
    for name, job, weights in variants(args.n, args.k):
        _compiled.clear()
        job()
        s = analyse(name, _compiled[-1], weights, args.dump)
        print(f"{s.name:44s} {s.regs:4d} {s.smem:6d} {s.local:5d} {s.loop:5d} {s.weights:5d} {s.loop / s.weights:5.2f}"
              + "".join(f" {s.counts[f]:6d}" for f in FAMILIES))  # fmt: skip
    print("loop = SASS instructions per trip of the main loop (one thread); w/thr = weights one thread decodes per "
          "trip; /w = loop / w/thr; LDG counts plain global loads, LDGSTS async copies; spill = local + stack bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
