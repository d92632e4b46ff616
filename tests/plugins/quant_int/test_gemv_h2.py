"""The f16x2 GEMV (quant_int/gemv_h2.py) against dequantize-then-matmul in fp32.

CPU (CI): the PTX of every format's decode + dot run in test_ptx_decode's emulator over random
words with exact integer arithmetic (every bit trick checked against the formats' own code rules);
the interpreted kernel at tiny sizes (row tails, several chunks and slices, M = 1..4); the split-K
counters' reset; the dispatch rules.
GPU (`-m gpu`): every registered 27B/35B shape class at M = 1..4, CUDA-graph replay, bit-equal
repeats.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

from ninfer_plugins.quant_int import formats as F  # noqa: E402
from ninfer_plugins.quant_int import gemv_h2 as H  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from ninfer_plugins.quant_int.linear import prepare_int  # noqa: E402
from ninfer_plugins.quant_nvfp4 import formats as NF  # noqa: E402
from ninfer_plugins.quant_nvfp4.kernels import prepare_nvfp4  # noqa: E402
from test_ptx_decode import f16_bits, f32_bits, f32_value, run_ptx  # noqa: E402  (same folder: pytest puts it on sys.path)

SCHEMES = ["q4_g64", "q5_g64", "q6_g64", "q8_g32"]
interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")
gpu = pytest.mark.gpu


# format id -> scheme, for every format the tuned tables may name
SCHEME_OF = {4: "q4_g64", 5: "q5_g64", 6: "q6_g64", 8: "q8_g32", 16: "nvfp4"}


def packed_and_ref(w: torch.Tensor, scheme: str):
    if scheme == "nvfp4":
        pk = NF.quantize(w)
        return prepare_nvfp4(pk), NF.dequantize(pk)
    pk = F.quantize(w, scheme)
    return prepare_int(pk), F.dequantize(pk)


def norm_inputs(n: int, k: int, seed: int, with_residual: bool, device: str):
    """(x, w, residual, a copy of it) for a (1 + w) RMSNorm test of n rows of k, bf16 on `device`
    (the residuals None without one): the norms that write a GEMV's prepared x (gemv_kw.norm_pairs,
    gemv_tkw.norm_xq) against rmsnorm, each given its own copy of the residual to add into."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, k, generator=g) * 4).to(torch.bfloat16).to(device)
    w = (torch.randn(k, generator=g) * 0.2).to(torch.bfloat16).to(device)
    res = (torch.randn(n, k, generator=g) * 2).to(torch.bfloat16).to(device) if with_residual else None
    return x, w, res, None if res is None else res.clone()


def count_launches(monkeypatch, module, name: str) -> list:
    """The grids of every launch of module.<name> (a Triton kernel) from now on, as a list."""
    grids, real = [], getattr(module, name)

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(module, name, Spy())
    return grids


def replayed(fn, times: int = 2):
    """fn() captured in one CUDA graph, then replayed `times` times: its output after each replay."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    for _ in range(times):
        g.replay()
        torch.cuda.synchronize()
        yield out


def test_every_tuned_format_has_a_packer():
    # the GPU check of the tuned tables (dispatched_in_a_graph) packs each named format: a format
    # added to a table without one here failed on the H200 only (NVFP4, 2026-12-03)
    from ninfer_plugins.quant_int.tuned import TUNED_H2, TUNED_TC

    assert {f for f, _, _, _ in (*TUNED_H2, *TUNED_TC)} <= set(SCHEME_OF)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


# --- the PTX, emulated (test_ptx_decode.run_ptx) ------------------------------------------------

def _code(u: int, bits: int) -> int:
    return u - (1 << bits) if u >> (bits - 1) else u


@pytest.mark.parametrize("fmt", [4, 5, 6, 8, 16])
@pytest.mark.parametrize("block_m", [1, 2, 4])
def test_dot_asm_names_every_operand(fmt, block_m):
    """Every %NAME in the asm text became a $N operand, and the operand count is what the
    constraint string declares (a stray name is a ptxas error only a GPU compile would show)."""
    import re

    text, n_in = H.dot_asm(fmt, block_m)
    assert not re.search(r"%[A-Za-z]", text), re.findall(r"%[A-Za-z]\w*", text)[:5]
    used = {int(v) for v in re.findall(r"\$(\d+)", text)}
    assert max(used) < 4 + 4 * n_in and set(range(4)) <= used
    _, constr = H._asm(fmt, block_m)
    assert constr.count("r") == 4 + 4 * n_in


@pytest.mark.parametrize("fmt", [4, 5, 6, 8])
@pytest.mark.parametrize("block_m", [1, 2, 4])
def test_ptx_decode_and_dot_exact(fmt, block_m):
    """Random words, bit words and small-integer x: the asm's fp32 outputs equal the exact sums
    of code * x * scale (every product and partial sum is an integer that fp16 holds exactly)."""
    asm, n_in = H.dot_asm(fmt, block_m)
    g = torch.Generator().manual_seed(fmt * 10 + block_m)
    parts = ("A", "C") if fmt == 8 else ("A", "B", "C", "D")
    for trial in range(24):
        words = [int(v) for v in torch.randint(0, 1 << 32, (4,), generator=g, dtype=torch.int64)]
        hl_raw, hh_raw = (int(v) for v in torch.randint(0, 1 << 32, (2,), generator=g, dtype=torch.int64))
        sh = 16 * (trial % 2) if fmt == 5 else 0  # q5: the run's 16 bits are the word's low or high half
        hl, hh = hl_raw >> sh, hh_raw >> sh
        s_lo, s_hi = 0.5, 0.25
        ops: dict[int, int] = {}
        slot = 4
        for j in range(4):
            ops[slot + j] = words[j]
        slot += 4
        if fmt in (5, 6):
            for j in range(4):
                ops[slot + j], ops[slot + 4 + j] = hl_raw, hh_raw
            slot += 8
        if fmt == 5:
            for j in range(4):
                ops[slot + j] = sh
            slot += 4
        for j in range(4):
            ops[slot + j] = f32_bits(s_lo) if fmt == 8 else (f16_bits(s_lo) | f16_bits(s_hi) << 16)
        slot += 4
        # x: element e of word j's low group and high group, small integers
        xs = torch.randint(-3, 4, (block_m, 2, 16), generator=g).tolist()
        for m in range(block_m):
            for part in parts:
                for j in range(4):
                    lo_hi = 0 if part in "AC" else 1
                    e0, e1 = (0, 2) if part in "AB" else (1, 3)
                    factor = H.X_FACTORS[fmt]["ABCD".index(part)]
                    a, b = xs[m][lo_hi][4 * j + e0] * factor, xs[m][lo_hi][4 * j + e1] * factor
                    if fmt == 8:  # q8: both groups' x are the word's own four bytes' x
                        a, b = xs[m][0][4 * j + e0], xs[m][0][4 * j + e1]
                    ops[slot + j] = f16_bits(a) | f16_bits(b) << 16
                slot += 4
        assert slot == 4 + 4 * n_in
        regs = run_ptx(asm, ops)
        for m in range(4):
            got = f32_value(regs[f"${m}"])
            if m >= block_m:
                assert got == 0.0
                continue
            want = 0.0
            for j, w in enumerate(words):
                for i in range(4):
                    byte = (w >> (8 * i)) & 0xFF
                    if fmt == 8:
                        want += _code(byte, 8) * xs[m][0][4 * j + i] * s_lo
                        continue
                    ulo, uhi = byte & 0xF, byte >> 4
                    if fmt > 4:
                        wb = fmt - 4
                        ulo |= ((hl >> ((4 * j + i) * wb)) & ((1 << wb) - 1)) << 4
                        uhi |= ((hh >> ((4 * j + i) * wb)) & ((1 << wb) - 1)) << 4
                    want += _code(ulo, fmt) * xs[m][0][4 * j + i] * s_lo + _code(uhi, fmt) * xs[m][1][4 * j + i] * s_hi
            assert got == want, (fmt, block_m, trial, m, got, want)


# --- the kernel, interpreted -------------------------------------------------------------------

@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    "m,n,k,cfg",
    [
        (1, 70, 512, H.H2Config(32, 2, 1)),  # row tail, 2 slices, one chunk of 3 trips
        (2, 64, 256, H.H2Config(32, 1, 2)),  # 2 slices of one K block
        (3, 96, 1024, H.H2Config(32, 4, 1, prefetch=False)),
        (4, 48, 512, H.H2Config(16, 2, 8)),
        (1, 80, 512, H.H2Config(16, 2, 2, prefetch=2)),  # ping-pong, odd trip count
        (3, 64, 512, H.H2Config(16, 2, 1, prefetch=2)),  # ping-pong, even trip count
        (2, 48, 256, H.H2Config(32, 1, 2, early=True)),
        # 3 chunks of 2, 2 and 1 trips (the CPU counts one SM): per-chunk ends and tails
        (1, 80, 512, H.H2Config(16, 2, 6)),
        (4, 80, 512, H.H2Config(16, 2, 6, prefetch=2)),
        (2, 80, 512, H.H2Config(16, 2, 6, prefetch=2, pin=True)),  # pinned loads (a no-op when interpreted)
    ],
)
def test_interpreted_h2_matches_reference(scheme, m, n, k, cfg):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    y = H.launch(x, p, cfg)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x.float() @ deq.T) < 6e-3


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m,n,k,cfg", [(1, 70, 512, H.H2Config(32, 2, 1)), (3, 80, 512, H.H2Config(16, 2, 2, prefetch=2)),
                                       (2, 100, 1024, H.H2Config(16, 4, 1))])
def test_interpreted_h2_l2_ahead_changes_nothing(scheme, m, n, k, cfg):
    """With a budget (NINFER_L2PF) each CTA asks the L2 for its next row trips before waiting on
    the kernel before (interpreted: reads them and drops them); rows past a chunk are clamped to
    its last. The output is bit-equal to the launch without."""
    g = torch.Generator().manual_seed(n + k)
    p, _ = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    assert H.l2_ahead_trips(p, cfg, 1 << 30) > 0 and H.l2_ahead_trips(p, cfg, 0) == 0
    assert torch.equal(H.launch(x, p, cfg, l2_budget=1 << 30), H.launch(x, p, cfg, l2_budget=0))


@interp
def test_interpreted_h2_large_and_tiny_x():
    """x with a huge and a tiny scale: the per-slice power-of-two scaling keeps both exact."""
    g = torch.Generator().manual_seed(7)
    p, deq = packed_and_ref(torch.randn(32, 512, generator=g), "q6_g64")
    for scale in (3e4, 1e-6):
        x = (torch.randn(1, 512, generator=g) * scale).to(torch.bfloat16)
        assert rel_err(H.launch(x, p, H.H2Config(32, 2, 1)), x.float() @ deq.T) < 6e-3


@interp
def test_interpreted_h2_counters_reset():
    g = torch.Generator().manual_seed(3)
    p, deq = packed_and_ref(torch.randn(64, 1024, generator=g), "q4_g64")
    x = torch.randn(2, 1024, generator=g).to(torch.bfloat16)
    cfg = H.H2Config(32, 1, 4)
    for _ in range(2):  # the second launch relies on the first having reset its counters
        a = H.launch(x, p, cfg)
        assert int(K.Workspace.get(torch.device("cpu")).counters.abs().sum()) == 0
        assert rel_err(a, x.float() @ deq.T) < 6e-3


@interp
@pytest.mark.parametrize("scheme", ["q4_g64", "q8_g32", "nvfp4"])
@pytest.mark.parametrize("m,n,cfg", [(1, 80, H.H2Config(16, 2, 6)), (3, 1100, H.H2Config(32, 2, 1)),
                                     (2, 2100, H.H2Config(64, 2, 2))])
def test_interpreted_h2_with_the_residual_add_and_norm(scheme, m, n, cfg):
    """add_norm: the last chunk to finish adds y to the residual and normalises it (several
    chunks; rows past 1,024 and 2,048: the norm's column pieces) -> the GEMV then cuda_fast's
    add_rms_norm kernel, the residual bit for bit, the norm to its last bf16 bit."""
    from ninfer.kernels.triton.norms import rmsnorm

    g = torch.Generator().manual_seed(m * 100 + n)
    p, _ = packed_and_ref(torch.randn(n, 512, generator=g), scheme)
    x = torch.randn(m, 512, generator=g).to(torch.bfloat16)
    res = (torch.randn(m, n, generator=g) * 4).to(torch.bfloat16)
    nw = (torch.randn(n, generator=g) * 0.2).to(torch.bfloat16)
    K.Workspace.get(torch.device("cpu")).reserve(*H.workspace_need(p, cfg))
    res_ref = res.clone()
    y_ref = H.launch(x, p, cfg)
    h_ref = rmsnorm(y_ref, nw, 1e-6, residual=res_ref)
    h = torch.full_like(res, float("nan"))
    for _ in range(2):  # the chunks' counter is re-armed: a second launch folds again
        res_fold = res.clone()
        y = H.launch(x, p, cfg, add_norm=(res_fold, nw, 1e-6, h))
        assert torch.equal(y, y_ref) and torch.equal(res_fold, res_ref)
        torch.testing.assert_close(h.float(), h_ref.float(), atol=0, rtol=1e-2)
        assert int(K.Workspace.get(torch.device("cpu")).counters.abs().sum()) == 0


@interp
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64", "q8_g32", "nvfp4"])
@pytest.mark.parametrize("m,n,k,cfg", [(1, 80, 512, H.H2Config(16, 2, 6)), (3, 48, 1024, H.H2Config(32, 4, 1)),
                                       (2, 64, 512, H.H2Config(16, 2, 2, prefetch=2, early=True))])
def test_interpreted_h2_gated_input_is_silu_mul_then_the_gemv(scheme, m, n, k, cfg):
    """gated: x2 = [gate | up] rows (here inside a wider buffer: any row stride) and the GEMV's
    input silu(gate) * up, rounded once to bf16 as it prepares its slice -> the same x values as
    the silu_mul launch stores, so the same output bit for bit."""
    from ninfer_plugins.cuda_fast.ops import silu_mul

    g = torch.Generator().manual_seed(m * 10 + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    wide = (torch.randn(m, 2 * k + 64, generator=g) * 3).to(torch.bfloat16)
    gu = wide[:, : 2 * k]
    act = silu_mul(gu[:, :k], gu[:, k:])
    want = H.launch(act, p, cfg)
    y = H.launch(gu, p, cfg, gated=True)
    assert torch.equal(y, want)
    assert rel_err(y, act.float() @ deq.T) < 6e-3


def test_h2_rejects_what_it_cannot_do():
    g = torch.Generator().manual_seed(1)
    p, _ = packed_and_ref(torch.randn(16, 384, generator=g), "q4_g64")
    with pytest.raises(ValueError, match="K % 512"):
        H.launch(torch.zeros(1, 384, dtype=torch.bfloat16), p, H.H2Config(32, 4, 4))
    with pytest.raises(ValueError, match="at most 4 rows"):
        H.launch(torch.zeros(5, 384, dtype=torch.bfloat16), p, H.H2Config(32, 1, 4))
    z = torch.zeros(1, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="add_norm"):
        H.launch(torch.zeros(1, 384, dtype=torch.bfloat16), p, H.H2Config(32, 1, 4), add_norm=(z, z[0, :8], 1e-6, z))
    with pytest.raises(ValueError, match="gated input"):
        H.launch(torch.zeros(1, 384, dtype=torch.bfloat16), p, H.H2Config(32, 1, 4), gated=True)


def test_dispatch_takes_h2_at_one_row(monkeypatch):
    monkeypatch.setenv("NINFER_KW", "0")  # the dispatch without the K-walks (tuned.TUNED_KW and TUNED_TKW off)
    monkeypatch.setenv("NINFER_TKW", "0")
    assert isinstance(K.pick_gemv(4, 1, 34816, 5120, 132), H.H2Config)
    assert isinstance(K.pick_gemv(8, 1, 8192, 2048, 132), H.H2Config)
    # NVFP4 at one row: its tuned winner, and the NVFP4 default where a shape was not tuned
    assert K.pick_gemv(16, 1, 34816, 5120, 132) == H.H2Config(16, 8, 6, 4, 2, False)
    assert K.pick_gemv(16, 1, 6144, 5120, 132) == H.H2Config(16, 8, 6, 4, 1, True)
    # NVFP4 at M = 4 where the MMA kernel won: not this kernel
    assert not isinstance(K.pick_gemv(16, 4, 5120, 17408, 132), H.H2Config)
    # K not a multiple of 256: the CUDA-core GEMV's rules
    assert not isinstance(K.pick_gemv(5, 1, 100, 200, 132), H.H2Config)
    # M = 2..4: only the measured wins ('m4' entries); () means the kernel dispatched before it
    # (q5 down at M = 4 with the tensor-core kernels off: since 2026-12-04 the direct tensor-core
    # GEMV's TUNED_TC entry takes it first)
    monkeypatch.setenv("NINFER_TC", "0")
    assert isinstance(K.pick_gemv(5, 4, 5120, 17408, 132), H.H2Config)
    monkeypatch.delenv("NINFER_TC")
    assert not isinstance(K.pick_gemv(4, 4, 34816, 5120, 132), H.H2Config)


def test_dispatch_switch_off(monkeypatch):
    monkeypatch.setenv("NINFER_H2", "0")
    assert not isinstance(K.pick_gemv(4, 1, 34816, 5120, 132), H.H2Config)
    assert not isinstance(K.pick_gemv(5, 4, 5120, 17408, 132), H.H2Config)


def test_configs_with_fewer_than_four_words_a_thread_are_refused():
    """Triton would lay such a tile out two words a thread and pad the asm's pack of four with
    undefined registers: wrong on the GPU, so neither the tables nor a caller may use one."""
    p = prepare_int(F.quantize(torch.randn(64, 512), "q4_g64"))
    assert not H.supports(p, H.H2Config(16, 1, 2))  # 16 words x 16 rows < 4 x 128 threads
    assert H.supports(p, H.H2Config(32, 1, 2))
    from ninfer_plugins.quant_int.tuned import TUNED_H2

    for (fmt, n, k, _), cfg in TUNED_H2.items():
        if cfg:
            assert H._fits(fmt, k, H.H2Config(*cfg)), (fmt, n, k, cfg)


# --- the GPU ------------------------------------------------------------------------------------

SHAPES = [(34816, 5120), (17408, 5120), (5120, 17408), (16384, 5120), (5120, 6144), (1024, 5120), (8192, 2048),
          (2048, 4096), (512, 2048), (1024, 2048), (2048, 512)]


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gpu_h2_every_shape_class(scheme):
    torch.manual_seed(0)
    for n, k in SHAPES:
        p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
        dflt = H.default_config(p.fmt, n, k)
        # pinned: the next tile's loads kept ahead of the math (pf and ping-pong)
        pinned = () if dflt is None else (H.H2Config(dflt.block_n, dflt.kbs, dflt.ctas, dflt.num_warps, 1, dflt.early, True),
                                          H.H2Config(dflt.block_n, dflt.kbs, dflt.ctas, dflt.num_warps, 2, dflt.early, True))
        for cfg in (dflt, H.H2Config(16, 2, 8), H.H2Config(64, 1, 2, 8), *pinned):
            if cfg is None or not H.supports(p, cfg):
                continue
            K.Workspace.get(p.device).reserve(*H.workspace_need(p, cfg))
            for m in (1, 2, 3, 4):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                err = rel_err(H.launch(x, p, cfg), x.float() @ deq.T)
                assert err < 6e-3, (scheme, n, k, m, cfg, err)


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_gpu_h2_graph_replay_and_bit_equal_repeats():
    torch.manual_seed(1)
    p, deq = packed_and_ref(torch.randn(5120, 17408, device="cuda", dtype=torch.bfloat16), "q5_g64")
    cfg = H.default_config(p.fmt, p.n, p.k)
    K.Workspace.get(p.device).reserve(*H.workspace_need(p, cfg))
    x = torch.randn(1, 17408, device="cuda", dtype=torch.bfloat16)
    first = H.launch(x, p, cfg)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = H.launch(x, p, cfg)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, first)
    assert rel_err(first, x.float() @ deq.T) < 6e-3


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_gpu_dispatched_configs_in_a_graph():
    """Every shape of tuned.TUNED_H2 through kernels.launch as the engine calls it: workspace
    reserved at load (a fresh one), then M = 1..4 captured in a CUDA graph against the fp32
    reference."""
    from ninfer_plugins.quant_int.tuned import TUNED_H2

    dispatched_in_a_graph(TUNED_H2, (1, 2, 3, 4))


def dispatched_in_a_graph(table: dict, ms: tuple[int, ...]) -> None:
    """Every shape a tuned table names a winner for, through kernels.launch as the engine calls
    it: workspace reserved at load (a fresh one), each M captured in a CUDA graph, against the
    fp32 reference (test_gemv_tc shares it)."""
    torch.manual_seed(2)
    K.Workspace._by_device.pop(torch.device("cuda", torch.cuda.current_device()), None)
    for fmt, n, k in sorted({(f, n, k) for (f, n, k, _), c in table.items() if c}):
        p, deq = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), SCHEME_OF[fmt])
        K.reserve_workspace(p)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            K.launch(x, p)  # compile outside the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = K.launch(x, p)
            g.replay()
            torch.cuda.synchronize()
            assert rel_err(y, x.float() @ deq.T) < 6e-3, (fmt, n, k, m)
        del p, deq


def test_workspace_growth_keeps_the_outgrown_buffers():
    # a graph captured before a growth keeps pointing at the old buffers: they must stay allocated
    ws = K.Workspace(torch.device("cpu"))
    ws.reserve(100, 10)
    old_p, old_c = ws.partials.data_ptr(), ws.counters.data_ptr()
    ws.reserve(150, 12)
    assert ws.partials.numel() >= 200 and ws.counters.numel() >= 20  # at least doubled
    assert {t.data_ptr() for t in ws._retired} == {old_p, old_c}
    assert int(ws.counters.abs().sum()) == 0
    ws.reserve(150, 12)  # fits: nothing moves
    assert len(ws._retired) == 2


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme,n,k", [("q5_g64", 5120, 6144), ("q5_g64", 5120, 17408), ("q8_g32", 2048, 4096),
                                        ("nvfp4", 5120, 17408)])
def test_gpu_h2_with_the_residual_add_and_norm_in_a_graph(scheme, n, k, monkeypatch):
    """The fold through the engine's entry (TritonQuantLinear.apply_add_norm, NINFER_GEMV_NORM=1)
    at the o_proj / out_proj / down_proj shapes, captured in a CUDA graph, against the GEMV then
    the add_rms_norm kernel: residual bit for bit, the norm to a last bf16 bit."""
    from ninfer.kernels.triton.norms import rmsnorm
    from ninfer.linear import AddNorm
    from ninfer_plugins.quant_int.linear import TritonQuantLinear

    monkeypatch.setenv("NINFER_GEMV_NORM", "1")
    # the fold is the f16x2 GEMV's: keep the K-walks (the dispatched kernel at 5120 x 17408) out
    monkeypatch.setenv("NINFER_KW", "0")
    monkeypatch.setenv("NINFER_TKW", "0")
    torch.manual_seed(3)
    p, _ = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
    K.reserve_workspace(p)
    kern = TritonQuantLinear.__new__(TritonQuantLinear)  # apply_add_norm reads nothing of the instance
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    res = (torch.randn(1, n, device="cuda") * 4).bfloat16()
    nw = (torch.randn(n, device="cuda") * 0.2).bfloat16()
    res_ref = res.clone()
    h_ref = rmsnorm(K.launch(x, p), nw, 1e-6, residual=res_ref)
    work = res.clone()
    an = AddNorm(work, nw, 1e-6)
    assert kern.apply_add_norm(x, p, an) is not None and an.out is not None  # compiled outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        an = AddNorm(work, nw, 1e-6)
        kern.apply_add_norm(x, p, an)
    for _ in range(2):
        work.copy_(res)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(work, res_ref)
        torch.testing.assert_close(an.out.float(), h_ref.float(), atol=0, rtol=1e-2)


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("scheme,n,k", [("q5_g64", 5120, 17408), ("q4_g64", 5120, 17408), ("nvfp4", 5120, 17408),
                                        ("q8_g32", 2048, 6144)])
def test_gpu_h2_gated_down_projection_in_a_graph(scheme, n, k, monkeypatch):
    """silu(gate) * up inside the down projection's launch, through the engine's entry
    (TritonQuantLinear.apply_gated, on unless NINFER_GEMV_GATED=0), captured in a CUDA graph: bit-equal to
    silu_mul then the dispatched GEMV, at the 27B's down_proj shape."""
    from ninfer_plugins.cuda_fast.ops import silu_mul
    from ninfer_plugins.quant_int.linear import TritonQuantLinear

    torch.manual_seed(5)
    p, _ = packed_and_ref(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), scheme)
    K.reserve_workspace(p)
    kern = TritonQuantLinear.__new__(TritonQuantLinear)  # apply_gated reads nothing of the instance
    gu = (torch.randn(1, 2 * k, device="cuda") * 2).bfloat16()
    want = K.launch(silu_mul(gu[:, :k], gu[:, k:]), p)
    monkeypatch.setenv("NINFER_GEMV_GATED", "0")
    assert kern.apply_gated(gu, p) is None  # off when asked
    monkeypatch.delenv("NINFER_GEMV_GATED")
    assert torch.equal(kern.apply_gated(gu, p), want)  # compiled outside the capture
    for y in replayed(lambda: kern.apply_gated(gu, p)):
        assert torch.equal(y, want)


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k,cfg", [(250, 1024, H.H2Config(32, 2, 1)), (256, 1024, H.H2Config(16, 8, 1)),
                                     (80, 512, H.H2Config(16, 2, 6))])
def test_interpreted_h2_l2_ahead_addresses_in_bounds(scheme, n, k, cfg, monkeypatch):
    """Every address the CTAs ask the L2 for lies in the weight's words, bit words or scales (a
    recorder in l2_prefetch's place: the interpreter looks it up at each call)."""
    import numpy as np

    from ninfer.kernels.triton import prefetch as PF

    g = torch.Generator().manual_seed(n + k)
    p, _ = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    seen = []
    monkeypatch.setattr(PF, "l2_prefetch", lambda P, ASM: seen.append(np.asarray(P.handle.data).ravel().astype(np.int64)))
    H.launch((torch.randn(1, k, generator=g)).to(torch.bfloat16), p, cfg, l2_budget=1 << 30)
    assert seen, "nothing asked ahead"
    addrs = np.unique(np.concatenate(seen)).tolist()
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (p.qweight, p.qhigh, p.scales) if t is not None]
    assert all(any(lo <= a < hi for lo, hi in spans) for a in addrs)
