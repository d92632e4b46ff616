"""The GEMV of 1-4 x rows over q4/q5/q6/q8 and NVFP4 weights in CUDA C++ (gemv_cu.cu), built with nvcc on first
use and called through ctypes; x's pairs come from the K-walk's preparation (gemv_kw.xpairs).

Built once per source, nvcc and GPU architecture into NINFER_CACHE (default ~/.cache/ninfer)/cuda/;
where nvcc or a CUDA GPU is missing `unavailable()` says why and nothing dispatches here, and a
library that cannot launch (a driver older than nvcc's runtime) is reported once and given up for
the process. The library links its own static CUDA runtime; launches go to PyTorch's current
stream (so CUDA-graph capture records them), with programmatic dependent launch when the Triton
kernels use it.

`decode_words` emulates the kernel's decode (its integer and fp16 steps, in numpy) so that the
CPU tests check every bit of the layout and the q5 permutation; the GPU tests check the kernel.
"""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import hashlib
import os
import shutil
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
import torch

SOURCE = Path(__file__).with_name("gemv_cu.cu")
FORMATS = (4, 5, 6, 8, 16)  # q4_g64, q5_g64, q6_g64, q8_g32, NVFP4 (quant_nvfp4, "g16-split8-f16")
# x rows -> the (rows a warp, vectors a row ahead, warps a row group) the library holds (gemv_cu.cu: pick)
BUILT = {1: ((1, 1, 1), (1, 2, 1), (1, 4, 1), (2, 1, 1), (2, 2, 1), (2, 4, 1), (4, 1, 1), (4, 2, 1), (8, 1, 1),
             (1, 2, 2), (2, 1, 2), (2, 2, 2), (4, 1, 2), (2, 1, 4)),
         2: ((1, 1, 1), (2, 1, 1), (2, 2, 1), (4, 1, 1)), 3: ((1, 1, 1), (2, 1, 1), (2, 2, 1), (4, 1, 1)),
         4: ((1, 1, 1), (2, 1, 1), (2, 2, 1), (4, 1, 1), (2, 1, 2), (1, 1, 2))}
MAX_M = 4
# the pipelined walk (gemv_cu.cu: PF = 1, the next trip's loads issued before this trip's decode):
# x rows -> the (rows a warp, vectors a row ahead, warps a row group) built with it
BUILT_PF = {1: ((1, 1, 1), (2, 1, 1), (4, 1, 1), (2, 2, 1), (2, 1, 2), (2, 1, 4), (4, 1, 2)),
            4: ((1, 1, 1), (2, 1, 1), (2, 1, 2), (1, 1, 2))}
# the tensor-core form (gemv_cu.cu: gemv_mma): formats and (K blocks ahead, warps a row group) built
MMA_FORMATS = (4, 5, 16)
# the library's format code for q5 reading its high bits as prepared words (q5_words)
Q5_WORDS = 21
# (2, 4), (1, 8), (2, 8): long-K shapes with few rows (q5 down, 5120 x 17408: 320 row groups of 16 at
# KS = 1, 2.4 warps an SM) keep more bytes in flight by splitting K over more warps of a CTA
BUILT_MMA = ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4), (2, 4), (1, 8), (2, 8))
# ... and with the pipelined walk
BUILT_MMA_PF = ((1, 2), (2, 2), (1, 4), (2, 4), (1, 8), (2, 8))
# ... and with the codes' offsets taken out by an MMA (q4/q5 only): (K blocks ahead, warps a row
# group, pipelined)
BUILT_MMA_OFS = ((1, 2, 0), (2, 2, 0), (1, 4, 0), (2, 4, 0), (1, 8, 0), (2, 8, 0), (2, 2, 1), (2, 4, 1), (1, 8, 1),
                 (2, 8, 1))
# ... and with K split over CTAs too (`kc` CTAs a row group; not pipelined, no ofs): (K blocks ahead,
# warps a row group, CTAs a row group). For long-K shapes with few row groups: q5 down at M = 4 (320
# row groups of 16 on 132 SMs) ran 2-3 CTAs an SM, so the SMs with three set the time.
BUILT_MMA_KC = ((1, 4, 2), (1, 8, 2), (2, 4, 2), (2, 8, 2), (1, 4, 4), (1, 8, 4), (2, 2, 2))
_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL] = {}
log = structlog.get_logger("ninfer.quant_int")


@dataclass(frozen=True)
class CUConfig:
    rows: int = 4  # rows a warp
    unroll: int = 1  # 16-byte vectors of each row a lane loads ahead
    num_warps: int = 4
    ksplit: int = 1  # warps sharing a row group, each walking every ksplit-th trip of K
    # the tensor-core form (gemv_mma: q4/q5/NVFP4, 16 rows a warp, `unroll` K blocks of 128 ahead)
    mma: bool = False
    # 1: the pipelined walk (BUILT_PF, BUILT_MMA_PF)
    pf: int = 0
    # 1 (tensor-core form, q4/q5): the pairs keep their offsets, an MMA takes them out (BUILT_MMA_OFS)
    ofs: int = 0
    # > 1 (tensor-core form): K split over `kc` CTAs a row group as well, summed by the last to
    # finish through the split-K workspace (BUILT_MMA_KC)
    kc: int = 1
    # 1: q5 measured on its prepared high-bit words (a TUNED_CU entry keyed Q5_WORDS); a weight
    # without words runs its plain entry instead (launch)
    words: int = 0

    def describe(self) -> str:
        ks = f" ks{self.ksplit}" if self.ksplit > 1 else ""
        if self.mma:
            return (f"cu mma U{self.unroll} w{self.num_warps}{ks}" + (f" kc{self.kc}" if self.kc > 1 else "")
                    + (" pf" if self.pf else "") + (" ofs" if self.ofs else "") + (" words" if self.words else ""))
        return f"cu R{self.rows} U{self.unroll} w{self.num_warps}" + ks + (" pf" if self.pf else "") + (" words" if self.words else "")

    @property
    def rows_a_cta(self) -> int:
        return self.rows * (self.num_warps // self.ksplit)

    def groups(self, n: int) -> int:
        """Row groups of 16 the grid covers (the tensor-core form): CTAs across times groups a CTA."""
        return -(-n // self.rows_a_cta) * (self.num_warps // self.ksplit)

    def workspace(self, p) -> tuple[int, int]:
        """(fp32 elements, counters) of the split-K workspace a launch needs: with kc > 1 each chunk's
        sums, 128 a row group (32 lanes x 4), and a counter a row group."""
        if self.kc <= 1:
            return 0, 0
        return self.kc * self.groups(p.n) * 128, self.groups(p.n)

    def run(self, x2: torch.Tensor, p, fast: bool | None = None) -> torch.Tensor:
        return launch(x2, p, self)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}"


def unavailable(device: torch.device) -> str | None:
    """Why the CUDA GEMV cannot run on `device` (None: it can)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return "needs compute capability 8.0 or later"
    if _nvcc() is None:
        return "no nvcc (on PATH, $NVCC, $CUDA_HOME/bin or /usr/local/cuda/bin): the CUDA toolkit builds this kernel on first use"
    return None


def _nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), os.environ.get("CUDA_HOME") and f"{os.environ['CUDA_HOME']}/bin/nvcc",
                 "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def nvcc_command(arch: str, out: Path | str) -> list[str]:
    """The nvcc command that builds the library for sm_<arch> into `out` (bench/cu_sass.py counts
    the same build)."""
    return [_nvcc() or "nvcc", "-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "--shared",
            "-Xcompiler", "-fPIC", "-o", str(out), str(SOURCE)]


def library(device: torch.device) -> ctypes.CDLL:
    """The built library for `device`'s architecture, compiled on first use (about 10 s), with every
    kernel loaded on `device` (once a device). Raises RuntimeError where it cannot be built or loaded
    (nvcc failing, an unwritable cache, a library the loader refuses, a driver too old)."""
    arch, index = _arch(device), _index(device)
    with _LOCK:
        lib = _LIBS.get(arch)
        if lib is None:
            try:
                lib = _build_and_load(arch)
            except OSError as exc:
                raise RuntimeError(f"the CUDA GEMV library for sm_{arch} cannot be built or loaded: {exc}") from exc
            _LIBS[arch] = lib
        if index not in _PRELOADED:
            # every kernel loaded now, not lazily at a first launch that may fall inside a graph capture
            rc = lib.ninfer_gemv_preload(index)
            if rc != 0:
                raise RuntimeError(f"the CUDA GEMV library built for sm_{arch} does not load on {device} (cudaError {rc})")
            _PRELOADED.add(index)
        return lib


_PRELOADED: set[int] = set()


def library_name(arch: str) -> str:
    """The library's file name for sm_<arch> in the cache (bench/prebuild_cu.py builds it under the
    same name): its tag covers the source, the architecture and `nvcc --version`."""
    version = subprocess.run([_nvcc() or "nvcc", "--version"], capture_output=True, text=True, check=False).stdout
    tag = hashlib.sha256(SOURCE.read_bytes() + arch.encode() + version.encode()).hexdigest()[:16]
    return f"gemv_cu_sm{arch}_{tag}.so"


def _build_and_load(arch: str) -> ctypes.CDLL:
    from ninfer.testing import cache_root

    out = cache_root() / "cuda" / library_name(arch)
    if not out.exists():
        log.info("building the CUDA GEMV with nvcc, once for this GPU architecture", arch=f"sm_{arch}", out=str(out))
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run(nvcc_command(arch, tmp), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed building {SOURCE.name} for sm_{arch}:\n{done.stderr[-2000:]}")
        os.replace(tmp, out)
    lib = ctypes.CDLL(str(out))
    fn = lib.ninfer_gemv
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 7 + [ctypes.c_int] * 3 + [ctypes.c_void_p, ctypes.c_int]
    mma = lib.ninfer_gemv_mma
    mma.restype = ctypes.c_int
    mma.argtypes = [ctypes.c_int] * 8 + [ctypes.c_void_p] * 9 + [ctypes.c_int] * 3 + [ctypes.c_void_p, ctypes.c_int]
    lib.ninfer_gemv_preload.restype = ctypes.c_int
    lib.ninfer_gemv_preload.argtypes = [ctypes.c_int]
    return lib


# rows a warp, unroll, warps: the config of a shape tuned.TUNED_CU does not name, under NINFER_CU_GEMV=1/4
DEFAULT = {1: CUConfig(2, 2, 4), 2: CUConfig(2, 1, 4), 3: CUConfig(2, 1, 4), 4: CUConfig(2, 1, 4)}


def mode() -> str:
    """NINFER_CU_GEMV: unset (the default) sends a launch here where tuned.TUNED_CU (or the
    NINFER_CU_TUNED file) names its (format, N, K, rows), that is where this kernel was measured to
    win; =1 those and every other one-token launch it can take (DEFAULT where nothing is tuned),
    =4 every launch of 1-4 rows, =0 none. Read at each launch so an A/B may switch it between runs
    of one process."""
    v = os.environ.get("NINFER_CU_GEMV", "")
    return v if v in ("0", "1", "4") else "tuned"


def enabled(m: int) -> bool:
    """Whether an m-row launch may come here (kernels.pick_decode), only where the kernel can run
    (`unavailable`, asked once a process)."""
    return mode() != "0" and 1 <= m <= MAX_M and _runs_here()


_RUNS: list[bool] = []


def _runs_here() -> bool:
    if not _RUNS:
        _RUNS.append(torch.cuda.is_available() and unavailable(torch.device("cuda")) is None)
    return _RUNS[0]


def pick(fmt: int, m: int, n: int, k: int) -> CUConfig | None:
    """The config for an m-row launch of a q4/q5/q6/q8/NVFP4 [n, k] weight: its measured winner (for q5
    first its winner on the prepared high-bit words, keyed Q5_WORDS, unless NINFER_Q5_WORDS=0), else
    (under NINFER_CU_GEMV=1/4) DEFAULT; None where the kernel does not apply or (by default) was not
    measured to win."""
    if fmt not in FORMATS or k % 128 or not 1 <= m <= MAX_M:
        return None
    # table by table (a bench's trial file, this card's, the shared one): the first that names the
    # shape decides, q5's winner on words ahead of its plain one there, so a trial file's plain
    # winner is not passed over for a lower table's words
    fmts = (Q5_WORDS, fmt) if fmt == 5 and not words_off() else (fmt,)
    for table in _tables():
        named = [f for f in fmts if (f, n, k, m) in table]
        if not named:
            continue
        for f in named:
            cfg = _config(table[(f, n, k, m)])
            if cfg is not None and _built(cfg, m, fmt):
                return dataclasses.replace(cfg, words=1) if f == Q5_WORDS else cfg
        break
    v = mode()
    return DEFAULT[m] if v == "4" or (v == "1" and m == 1) else None


def _built(cfg: CUConfig, m: int, fmt: int | None = None) -> bool:
    """A config the library holds for m x rows (a tuned entry that is not falls through); the
    tensor-core form only for q4/q5/NVFP4, 16 rows a warp."""
    if not (1 <= cfg.num_warps <= 8 and cfg.num_warps % cfg.ksplit == 0 and 1 <= m <= MAX_M):
        return False
    if cfg.kc != 1:
        return (cfg.mma and cfg.rows == 16 and cfg.pf == 0 and cfg.ofs == 0 and (cfg.unroll, cfg.ksplit, cfg.kc) in BUILT_MMA_KC
                and (fmt is None or fmt in MMA_FORMATS))
    if cfg.mma:
        if cfg.ofs:
            return (cfg.rows == 16 and cfg.ofs == 1 and (cfg.unroll, cfg.ksplit, cfg.pf) in BUILT_MMA_OFS
                    and (fmt is None or fmt in (4, 5)))
        built = BUILT_MMA_PF if cfg.pf == 1 else BUILT_MMA if cfg.pf == 0 else ()
        return cfg.rows == 16 and (cfg.unroll, cfg.ksplit) in built and (fmt is None or fmt in MMA_FORMATS)
    if cfg.ofs:
        return False
    built = BUILT_PF.get(m, ()) if cfg.pf == 1 else BUILT[m] if cfg.pf == 0 else ()
    return (cfg.rows, cfg.unroll, cfg.ksplit) in built and cfg.rows * m <= 32


def built_configs(m: int) -> list[CUConfig]:
    """Every config the library holds for m x rows at 4 and 8 warps, both forms (what a bench ranks
    and the GPU tests check): CUDA-core configs of at most 32 rows a CTA, tensor-core ones whose
    warps their K split divides."""
    core = [CUConfig(r, u, w, ks) for r, u, ks in BUILT[m] for w in (4, 8) if r * w // ks <= 32]
    core += [CUConfig(r, u, w, ks, pf=1) for r, u, ks in BUILT_PF.get(m, ()) for w in (4, 8) if r * w // ks <= 32]
    mma = [CUConfig(16, u, w, ks, True) for u, ks in BUILT_MMA for w in (4, 8) if w % ks == 0]
    mma += [CUConfig(16, u, w, ks, True, 1) for u, ks in BUILT_MMA_PF for w in (4, 8) if w % ks == 0]
    mma += [CUConfig(16, u, w, ks, True, 0, 0, kc) for u, ks, kc in BUILT_MMA_KC for w in (4, 8) if w % ks == 0]
    return core + mma + [CUConfig(16, u, w, ks, True, pf, 1) for u, ks, pf in BUILT_MMA_OFS for w in (4, 8) if w % ks == 0]


def _config(entry: tuple) -> CUConfig | None:
    """A table entry's config; None for () (measured to lose there, whatever a lower table says)."""
    return CUConfig(*entry) if entry else None


def tuned_entry(fmt: int, n: int, k: int, m: int) -> CUConfig | None:
    """The measured winner of (format, N, K, x rows) (format Q5_WORDS: q5 on its prepared words): the
    NINFER_CU_TUNED file's entry, else this card's (tuned.TUNED_CU_CARD, `card()`), else
    tuned.TUNED_CU's; None where none names it."""
    key = (fmt, n, k, m)
    for table in _tables():
        if key in table:
            return _config(table[key])
    return None


def _tables() -> tuple[dict, dict, dict]:
    return _trial_table(), _card_table(), _base_table()


def _base_table() -> dict:
    from ninfer_plugins.quant_int.tuned import TUNED_CU

    return TUNED_CU


def _card_table() -> dict:
    from ninfer_plugins.quant_int.tuned import TUNED_CU_CARD

    return TUNED_CU_CARD.get(card(), {})


_CARD: list[str] = []


def card() -> str:
    """The tag of this process's GPU in tuned.TUNED_CU_CARD ("H100", "H200"; "" for any other card or
    none). NINFER_CU_CARD (read each time) names one ("0": none, so only TUNED_CU applies): the H100
    and the H200 share their SMs but not their bandwidth, and some winners differ between them
    (q4 gate+up at M = 4: gemv_mma on the H100, the tensor-core K-walk on the H200)."""
    forced = os.environ.get("NINFER_CU_CARD")
    if forced is not None:
        return "" if forced == "0" else forced
    if not _CARD:
        _CARD.append(card_of(torch.cuda.get_device_name() if torch.cuda.is_available() else ""))
    return _CARD[0]


def card_of(name: str) -> str:
    """The TUNED_CU_CARD tag of a device name: only the cards the tables were measured on, the H100
    SXM ("NVIDIA H100 80GB HBM3") and the H200 ("NVIDIA H200"); not the H100 PCIe / NVL, the H200
    NVL or the GH200, whose bandwidth and clocks differ."""
    if "H100" in name and name.endswith("HBM3"):
        return "H100"
    return "H200" if name.strip() == "NVIDIA H200" else ""


def _keys_of(fmt: int) -> tuple[int, ...]:
    """The table formats that may name a weight of this format: q5's plain key and its words' key."""
    return (fmt, Q5_WORDS) if fmt == 5 else (fmt,)


def _tuned_shape(fmt: int, n: int, k: int) -> bool:
    return any(tuned_entry(fmt, n, k, m) is not None for m in range(1, MAX_M + 1))


def tuned_for(p) -> bool:
    """Whether a measured winner names this weight at some row count (q5: on its words too)."""
    return any(_tuned_shape(f, p.n, p.k) for f in _keys_of(p.fmt))


def words_tuned(n: int, k: int) -> bool:
    """Whether a q5 [n, k] weight has a winner measured on its prepared words at some row count."""
    return _tuned_shape(Q5_WORDS, n, k)


def words_for_k(k: int) -> bool:
    """Whether a winner on q5 words applies here to some shape of this K (the memory plan counts
    words for every q5 weight of that K: a merged weight's words, qkv + z's, are made for a shape
    the plan sees only as its parts, which share its K)."""
    return any(key[0] == Q5_WORDS and key[2] == k and t[key] for t in _tables() for key in t)


_TRIALS: dict[str, dict] = {}


def _trial_table() -> dict:
    """NINFER_CU_TUNED=<file>: entries (bench/cu_gemv_bench.py's tuned_cu.py, `TUNED_CU = {...}`)
    that take tuned.TUNED_CU's place, so one device call can time the step with the winners its
    bench just found; read once a file."""
    path = os.environ.get("NINFER_CU_TUNED")
    if not path:
        return {}
    if path not in _TRIALS:
        text = Path(path).read_text()
        _TRIALS[path] = ast.literal_eval(text.split("=", 1)[1].strip())
    return _TRIALS[path]


def _rows_covered(p, cfg: CUConfig) -> bool:
    """The weight's stored rows cover every row the CTAs read (n rounded up to the rows a CTA)."""
    return p.qweight.shape[0] >= -(-p.n // cfg.rows_a_cta) * cfg.rows_a_cta


def _applies(p, m: int) -> bool:
    return p.fmt in FORMATS and p.k % 128 == 0 and 1 <= m <= MAX_M


def supports(p, cfg: CUConfig, m: int = 1) -> bool:
    """A q4/q5/q6/q8/NVFP4 weight whose K is whole blocks of 128 and whose stored rows cover every row the
    CTAs read, at m x rows, with a config the library holds."""
    return _applies(p, m) and _built(cfg, m, p.fmt) and _rows_covered(p, cfg)


def ready(p) -> None:
    """Build and load the library when a weight it may serve is prepared (kernels.reserve_workspace),
    so nvcc never runs at a first launch inside a graph capture; by default only for a weight
    TUNED_CU names (a model with no winner never builds it); a library that cannot be built or
    loaded is given up here, once."""
    v = mode()
    if not (_applies(p, 1) and p.device.type == "cuda" and v != "0" and (v != "tuned" or tuned_for(p)) and _runs_here()):
        return
    try:
        library(p.device)
    except RuntimeError as exc:
        _give_up(str(exc))
        return
    if p.fmt == 5 and (words_on() or (not words_off() and words_tuned(p.n, p.k))):
        attach_words(p)
    _reserve_chunks(p)


def _reserve_chunks(p) -> None:
    """The split-K workspace of every K-chunked (kc > 1) winner that names this weight in any table
    (a run may switch tables after load, and a graph capture cannot grow it)."""
    from ninfer_plugins.quant_int import kernels as QK
    from ninfer_plugins.quant_int.tuned import TUNED_CU_CARD

    # every card's table, not only this one's: NINFER_CU_CARD may change between runs
    for table in (_trial_table(), _base_table(), *TUNED_CU_CARD.values()):
        for f in _keys_of(p.fmt):
            for m in range(1, MAX_M + 1):
                cfg = _config(table.get((f, p.n, p.k, m), ()))
                if cfg is not None and cfg.kc > 1:
                    QK.Workspace.get(p.device).reserve(*cfg.workspace(p))


# --- q5's high bits as prepared words ----------------------------------------------------------------
#
# The kernel permutes each vector's 32 q5 high bits (two 16-bit runs of qhigh) into Q, where one
# rotation a word puts that word's bits under its pairs (gemv_cu.cu: q5_bits, about 20 LOP3/SHF a
# vector and row with the two loads). Made once at load instead, one 32-bit word a vector
# [rows, V], the loop reads a word and permutes nothing: 3.97 -> 3.30 SASS instructions a weight at
# R2 U1 (bench/cu_sass.py). The words are a second copy of qhigh (1 bit a q5 weight) that only this
# kernel reads, so they are made only for weights with a winner measured on them (TUNED_CU entries
# keyed Q5_WORDS) or under NINFER_Q5_WORDS=1.


def words_on() -> bool:
    """NINFER_Q5_WORDS=1: every q5 weight the CUDA GEMV may serve gets its prepared high-bit words at
    load (read when a weight is prepared), and launches read them; =0 (read at each launch) keeps
    launches off words already made and off the winners measured on them, so one process may A/B
    them; unset: words are made for the weights with a winner on them (Q5_WORDS entries) and read
    where a weight has them (a bench or test may attach them)."""
    return os.environ.get("NINFER_Q5_WORDS", "") == "1"


def words_off() -> bool:
    return os.environ.get("NINFER_Q5_WORDS", "") == "0"


def q5_words(qhigh: torch.Tensor) -> torch.Tensor:
    """A q5 weight's high-bit plane (uint8 [rows, Kp / 8], layout kb128-v1) -> int32 [rows, Kp / 32]:
    per 16-byte vector v of the codes, q5_bits of its two 16-bit runs (lo16 | hi16 << 16), the word
    the kernel would have made (torch ops, on qhigh's device)."""
    rows, nb = qhigh.shape
    if nb % 16:
        raise ValueError(f"q5 high bits come 16 bytes a K block of 128, got a row of {nb} bytes")

    def rotl(x: torch.Tensor, r: int) -> torch.Tensor:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    out = torch.empty(rows, nb // 4, dtype=torch.int32, device=qhigh.device)
    # in row chunks: the int64 temporaries are ~12x their rows' qhigh
    for r0 in range(0, rows, 2048):
        b = qhigh[r0 : r0 + 2048].to(torch.int64).view(-1, nb // 16, 2, 4, 2)  # [row, block, lo/hi group, vector, byte]
        runs = b[..., 0] | (b[..., 1] << 8)  # [row, block, group, vector] 16-bit runs
        src = runs[:, :, 0] | (runs[:, :, 1] << 16)  # [row, block, vector]
        q = torch.zeros_like(src)
        for mask, r in _Q5_ROTATIONS:
            q |= rotl(src & mask, r)
        q = torch.where(q >= 2**31, q - 2**32, q)
        out[r0 : r0 + 2048] = q.to(torch.int32).reshape(q.shape[0], -1)
    return out


# q5_bits' masked rotations (gemv_cu.cu), the numpy emulation's and q5_words' one table
_Q5_ROTATIONS = ((0xC0C00303, 4), (0x00003030, 2), (0x00000C0C, 18), (0x0000C0C0, 16), (0x03030000, 24),
                 (0x30300000, 22), (0x0C0C0000, 6))


def attach_words(p) -> None:
    """Give a q5 weight its prepared words (q5_words), noted with the tensors they were made from."""
    p.q5words = (p.qweight, p.qhigh, q5_words(p.qhigh))


def words_of(p) -> torch.Tensor | None:
    """The weight's prepared q5 words, where they were made from its own qweight and qhigh (a
    weight derived by dataclasses.replace, a merged one or a row view, has none until its own are
    made)."""
    held = getattr(p, "q5words", None)
    if held is None or p.fmt != 5 or held[0] is not p.qweight or held[1] is not p.qhigh:
        return None
    return held[2]


def launch(x2: torch.Tensor, p, cfg: CUConfig, gated: bool = False) -> torch.Tensor:
    """y [M, n] bf16 = x2 [M, k] bf16 (gated: [M, 2k], silu(gate) * up) @ W.T, M = 1..4."""
    from ninfer.kernels.triton.launch import pdl_enabled, pdl_value
    from ninfer_plugins.quant_int import gemv_kw
    from ninfer_plugins.quant_int import kernels as QK

    m = x2.shape[0]
    width = 2 * p.k if gated else p.k
    if x2.dim() != 2 or x2.shape[1] != width or x2.stride(1) != 1 or x2.dtype != torch.bfloat16:
        raise ValueError(f"the CUDA GEMV takes x [M, {width}] bf16 with a unit last stride, got {tuple(x2.shape)} "
                         f"{x2.dtype} strides {tuple(x2.stride())}")
    cfg, words = _with_words(p, cfg, m)
    if _applies(p, m) and not _rows_covered(p, cfg):
        # rows the CTAs cannot tile without reading past the weight (a merged weight's part)
        return _fallback(x2, p, gated)
    if not supports(p, cfg, m):
        raise ValueError(f"the CUDA GEMV takes 1-4 rows of a q4/q5/q6/q8/NVFP4 weight with K a multiple of 128, got "
                         f"{tuple(x2.shape)} for q{p.fmt} {p.n}x{p.k} at {cfg.describe()}")
    if not _runs_here():
        return _fallback(x2, p, gated)
    try:
        lib = library(x2.device)
    except RuntimeError as exc:  # nvcc failed, or the library does not load here (an old driver)
        _give_up(str(exc))
        return _fallback(x2, p, gated)
    xp, _inv, invm = gemv_kw.pairs_of(x2, p.fmt, p.k, QK.block_rows(m), True, gated=gated)
    y = torch.empty(m, p.n, dtype=torch.bfloat16, device=x2.device)
    bits = Q5_WORDS if words is not None else p.fmt
    qh = words.data_ptr() if words is not None else p.qhigh.data_ptr() if p.qhigh is not None else 0
    gs = p.gscale.data_ptr() if p.fmt == 16 else 0
    device = _index(x2.device)
    pdl, stream = _pdl(pdl_enabled(x2.device), pdl_value()), torch.cuda.current_stream(x2.device).cuda_stream
    if cfg.mma:
        ws = cnt = 0
        if cfg.kc > 1:
            work = QK.Workspace.get(x2.device)
            work.ensure(*cfg.workspace(p), QK.capturing(x2))
            ws, cnt = work.partials.data_ptr(), work.counters.data_ptr()
        rc = lib.ninfer_gemv_mma(bits, m, cfg.unroll, cfg.ksplit, cfg.pf, cfg.ofs, cfg.kc, cfg.num_warps,
                                 p.qweight.data_ptr(), qh, p.scales.data_ptr(), gs, xp.data_ptr(), invm.data_ptr(),
                                 y.data_ptr(), ws, cnt, p.n, p.qweight.shape[1] // 16, pdl, stream, device)
    else:
        rc = lib.ninfer_gemv(bits, m, cfg.rows, cfg.unroll, cfg.ksplit, cfg.pf, cfg.num_warps, p.qweight.data_ptr(), qh,
                             p.scales.data_ptr(), gs, xp.data_ptr(), invm.data_ptr(), y.data_ptr(), p.n,
                             p.qweight.shape[1] // 16, pdl, stream, device)
    if rc == 0:
        return y
    if rc == 1000:
        raise RuntimeError(f"the CUDA GEMV library has no {cfg.describe()} kernel for q{p.fmt} at M = {m}")
    # a library that cannot launch here (cudaError 35: a driver older than nvcc's runtime; 209: no
    # kernel image for this GPU) will not launch later either
    _give_up(f"cudaError {rc} at a launch")
    return _fallback(x2, p, gated)


def _with_words(p, cfg: CUConfig, m: int) -> tuple[CUConfig, torch.Tensor | None]:
    """The config a launch runs and the prepared q5 words it reads (None: the runs of qhigh): words
    wherever the weight has its own (not under NINFER_Q5_WORDS=0); a winner measured on words
    (cfg.words) for a weight without them (a row view of a merged weight) runs the shape's plain
    winner instead, where the library holds one, else the same config on the runs of qhigh."""
    words = None if words_off() else words_of(p)
    if cfg.words and words is None:
        plain = tuned_entry(p.fmt, p.n, p.k, m)
        if plain is not None and supports(p, plain, m):
            return plain, None
    return cfg, words


def _pdl(enabled: bool, value) -> int:
    """The launcher's pdl argument: 0 off, 1 the trigger at the kernel's start, 2 after its wait
    (a launch inside launch.late_dependents(), whose dependents read before their own wait)."""
    return 0 if not enabled else 2 if value == 2 else 1


def _give_up(why: str) -> None:
    """Say once why the CUDA GEMV cannot run in this process, and dispatch nothing here again."""
    _RUNS[:] = [False]
    warnings.warn(f"the CUDA GEMV cannot run on this machine ({why}); the Triton kernels run instead",
                  RuntimeWarning, stacklevel=3)


def _fallback(x2: torch.Tensor, p, gated: bool) -> torch.Tensor:
    """The same product without this kernel: the K-walk's default config, or where the K-walk has
    none (q4/q5 with an odd count of K blocks) the tile kernel, on silu(gate) * up made apart."""
    from ninfer_plugins.quant_int import gemv_kw
    from ninfer_plugins.quant_int import kernels as K

    cfg = gemv_kw.default_config(p.fmt, p.n, p.k, p.sm_count)
    if cfg is not None:
        return gemv_kw.launch(x2, p, cfg, gated=gated)
    if gated:
        g, u = x2[:, : p.k].float(), x2[:, p.k :].float()
        x2 = (torch.nn.functional.silu(g) * u).to(x2.dtype)
    return K.launch(x2, p, K.pick_config(p.fmt, x2.shape[0], p.n, p.k, p.sm_count))


# --- the decode, emulated (CPU tests) ---------------------------------------------------------------


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    r %= 32
    return ((x << np.uint32(r)) | (x >> np.uint32(32 - r))) if r else x


def q5_bits(src: np.ndarray) -> np.ndarray:
    """gemv_cu.cu's q5_bits on uint32 arrays."""
    src = src.astype(np.uint32)
    q = np.zeros_like(src)
    for mask, r in _Q5_ROTATIONS:
        q |= _rotl(src & np.uint32(mask), r)
    return q


# the magic-number offsets the q4 / q5 decode subtracts from its pairs A, B, C, D (gemv_cu.cu:
# pair_offset; the tensor-core form's ofs configs leave them in and take them out by an MMA)
OFFSETS = {4: (1032, 1152, 1032, 1152), 5: (1040, 1280, 1056, 1536)}


def _h2(u: np.ndarray) -> np.ndarray:
    """uint32 [..] -> fp16 [.., 2] (low half first), as the kernel's h2()."""
    return u.astype(np.uint32).view(np.float16).reshape(*u.shape, 2)


def fp4_scales(sb: np.ndarray) -> np.ndarray:
    """gemv_cu.cu's fp4_scales: 16-bit pairs of E4M3 bytes -> fp32 [..., 2], each value times 2^-8."""
    sb = sb.astype(np.uint32)
    lo = ((sb & np.uint32(0x7F)) << np.uint32(7)) | ((sb & np.uint32(0x80)) << np.uint32(8))
    hi = ((sb & np.uint32(0x7F00)) << np.uint32(15)) | ((sb & np.uint32(0x8000)) << np.uint32(16))
    return _h2(lo | hi).astype(np.float32)


def decode_words(bits: int, words: np.ndarray, hbits: np.ndarray | None = None) -> np.ndarray:
    """Vectors of codes as the kernel decodes them: words uint32 [..., 4] (hbits uint32 [...], lo16 |
    hi16 << 16, for q5; [..., 2], the words HL and HH of qhigh, for q6) -> fp16 [..., 4 words, 4 pairs A, B, C, D, 2] of code multiples (1, 16, 1,
    16 for q4 and q6; 1, 16, 2, 32 for q5, as the x pairs' factors expect; q8: A and C the codes, B and D
    zeros; NVFP4: each code's E2M1 value times 2^-14, A/B element j / 8 + j of bytes 0 and 2, C/D
    of bytes 1 and 3)."""
    w = words.astype(np.uint32)
    out = np.empty((*w.shape, 4, 2), dtype=np.float16)
    if bits == 6:
        # q6: hbits [..., 2] (HL, HH); byte i of each holds word i's four elements' two high bits
        u32 = np.uint32
        hb = hbits.astype(np.uint32)
        i = np.arange(4, dtype=np.uint32)
        ul = (hb[..., 0:1] >> (u32(8) * i)) & u32(0xFF)  # [..., 4 words]
        uh = (hb[..., 1:2] >> (u32(8) * i)) & u32(0xFF)
        w8 = w >> u32(8)
        parts = (((((ul * u32(0x00010010)) & u32(0x00300030)) ^ ((w & u32(0x000F000F)) | u32(0x64206420))), 1056),
                 ((((uh * u32(0x00100100)) & u32(0x03000300)) ^ ((w & u32(0x00F000F0)) | u32(0x66006600))), 1536),
                 ((((ul * u32(0x00004004)) & u32(0x00300030)) ^ ((w8 & u32(0x000F000F)) | u32(0x64206420))), 1056),
                 ((((uh * u32(0x00040040)) & u32(0x03000300)) ^ ((w8 & u32(0x00F000F0)) | u32(0x66006600))), 1536))
    elif bits == 16:
        # NVFP4: A, B of bytes 0 and 2, then C, D of bytes 1 and 3, each E2M1 value times 2^-14
        u32 = np.uint32
        a = (w << u32(8)) & u32(0x8E008E00)
        c = w & u32(0x8E008E00)
        b = ((w & u32(0x00710071)) * u32(0x00008020)) & u32(0x8E008E00)
        d = ((w << u32(7)) & u32(0x80008000)) | ((w >> u32(3)) & u32(0x0E000E00))
        for i, h in enumerate((a, b, c, d)):
            out[..., i, :] = _h2(h)
        return out
    elif bits == 8:
        # bytes in natural order: A = (byte 0, byte 2), C = (byte 1, byte 3); B, D unused (zeros)
        t = w ^ np.uint32(0x80808080)
        byte = [(t >> np.uint32(8 * i)) & np.uint32(0xFF) for i in range(4)]
        magic = np.uint32(0x6400)
        a = (byte[0] | magic) | ((byte[2] | magic) << np.uint32(16))
        c = (byte[1] | magic) | ((byte[3] | magic) << np.uint32(16))
        out[..., 0, :] = _h2(a) - np.float16(1152)
        out[..., 2, :] = _h2(c) - np.float16(1152)
        out[..., 1, :] = 0
        out[..., 3, :] = 0
        return out
    elif bits == 4:
        w8 = w >> np.uint32(8)
        parts = tuple(zip(((w & 0x000F000F) ^ 0x64086408, (w & 0x00F000F0) ^ 0x64806480, (w8 & 0x000F000F) ^ 0x64086408,
                           (w8 & 0x00F000F0) ^ 0x64806480), OFFSETS[4], strict=True))
    else:
        q = q5_bits(hbits)[..., None]
        s = np.concatenate([_rotl(q, -k) for k in (0, 2, 8, 10)], axis=-1)  # rotr(Q, k) a word
        ns = ~s
        w7 = w >> np.uint32(7)
        magic = np.uint32(0x64006400)
        parts = tuple(zip(((w & 0x000F000F) | (ns & 0x00100010) | magic, (w & 0x00F000F0) | (ns & 0x01000100) | magic,
                           (w7 & 0x001E001E) | (ns & 0x00200020) | magic, (w7 & 0x01E001E0) | (ns & 0x02000200) | magic),
                          OFFSETS[5], strict=True))
    for i, (h, c) in enumerate(parts):
        out[..., i, :] = _h2(np.asarray(h, dtype=np.uint32)) - np.float16(c)
    return out
