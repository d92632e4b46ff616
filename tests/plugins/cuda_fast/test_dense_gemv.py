"""The one-token bf16 GEMV (cuda_fast/dense_gemv.py) against torch: F.linear, and SwiGLU then
F.linear for the gated form. Interpreted on the CPU at small shapes with row and K tails; on a GPU
at the 27B's shapes, eagerly and replayed in a CUDA graph, and through the kernel object's modes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ninfer_plugins.cuda_fast import dense_gemv as D

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def reference(x: torch.Tensor, w: torch.Tensor, gated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """F.linear in fp32 of x (gated: SwiGLU rounded to bf16 first), and the bound on |y - ref|: the
    output's bf16 rounding, fp32 sums in another order, and for the gated x one bf16 rounding of
    each element; each rounding 2^-7 relative, since Triton's interpreter truncates fp32 -> bf16
    where the GPU rounds to nearest (2^-8)."""
    xs = x.float()
    if gated:
        k = w.shape[1]
        g, u = x[:, :k].float(), x[:, k:].float()
        xs = g * torch.sigmoid(g) * u
        x = xs.to(x.dtype)
    ref = F.linear(x.float(), w.float())
    mag = F.linear(xs.abs(), w.float().abs())
    bound = ref.abs() * 2.0**-7 + mag * (2.0**-7 if gated else 1e-5) + 1e-6
    return ref, bound


def check(n: int, k: int, gated: bool, cfg, seed: int, dev: str = DEV) -> None:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).to(dev)
    x = torch.randn(1, 2 * k if gated else k, generator=g).to(torch.bfloat16).to(dev)
    y = D.gemv(x, w, gated=gated, cfg=cfg)
    ref, bound = reference(x, w, gated)
    assert y.shape == (1, n) and y.dtype == torch.bfloat16
    over = ((y.float() - ref).abs() - bound).max().item()
    assert over <= 0, (n, k, gated, cfg, over)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("n,k,cfg", [(19, 96, (8, 32, 2)), (16, 64, (4, 64, 1)), (5, 200, (8, 64, 2)), (33, 40, (16, 64, 4))])
def test_interpreted_gemv_against_torch(n, k, cfg, gated):
    """Row tails (n not a multiple of BN), K tails (k not a multiple of BK, and k < BK), gated and not."""
    if CUDA:
        pytest.skip("the interpreted form runs without a GPU")
    check(n, k, gated, cfg, seed=n * 131 + k)


def test_a_row_slice_of_a_merged_weight_and_bad_shapes():
    """w as a row slice of a larger weight (the parts of merge_dense) reads its own rows; a wrong x
    is a ValueError naming both shapes."""
    if CUDA:
        pytest.skip("the interpreted form runs without a GPU")
    g = torch.Generator().manual_seed(7)
    big = (torch.randn(40, 64, generator=g) * 0.05).to(torch.bfloat16)
    w = big[8:29]
    x = torch.randn(1, 64, generator=g).to(torch.bfloat16)
    y = D.gemv(x, w, cfg=(8, 32, 2))
    ref = F.linear(x.float(), w.float())
    assert (y.float() - ref).abs().max().item() < 1e-2 * (ref.abs().max().item() + 1e-3)
    with pytest.raises(ValueError, match="does not fit"):
        D.gemv(torch.zeros(1, 63, dtype=torch.bfloat16), w, cfg=(8, 32, 2))
    with pytest.raises(ValueError, match="does not fit"):
        D.gemv(x, w, gated=True, cfg=(8, 32, 2))


def test_modes_and_config_from_the_environment(monkeypatch):
    monkeypatch.delenv("NINFER_DENSE_GEMV", raising=False)
    monkeypatch.delenv("NINFER_DENSE_GEMV_CFG", raising=False)
    assert D.mode() == "all" and D.config() == D.DEFAULT_CFG
    monkeypatch.setenv("NINFER_DENSE_GEMV", "gated")
    monkeypatch.setenv("NINFER_DENSE_GEMV_CFG", "16:256:8")
    assert D.mode() == "gated" and D.config() == (16, 256, 8)
    monkeypatch.setenv("NINFER_DENSE_GEMV", "yes")
    with pytest.raises(ValueError, match="NINFER_DENSE_GEMV"):
        D.mode()


def test_the_kernel_is_chosen_for_bf16_only_on_a_gpu():
    """On a CPU the reference DenseKernel serves the bf16 scheme (this one needs CUDA); the hook
    answers only for the bf16 scheme."""
    from ninfer.device import probe
    from ninfer.linear import DENSE
    from ninfer.plugins import get_plugin_manager
    from ninfer_plugins.cuda_fast import plugin as P

    assert P.ninfer_linear_kernel(scheme="q4_g64", device=None, n=8, k=8) is None
    assert isinstance(P.ninfer_linear_kernel(scheme=DENSE, device=None, n=8, k=8), D.DenseGemvKernel)
    if not CUDA:
        choice = get_plugin_manager().choose("ninfer_linear_kernel", probe("cpu"), scheme=DENSE, n=8, k=8)
        assert choice.impl.name == "torch.linear"


# the 27B's bf16 projections at one token: down (gated), o_proj / out_proj, GDN in_proj merged,
# attention q+k+v merged, gate+up merged
GPU_SHAPES = [(5120, 17408, True), (5120, 6144, False), (16480, 5120, False), (14336, 5120, False), (34816, 5120, False)]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("n,k,gated", GPU_SHAPES)
@pytest.mark.parametrize("cfg", [D.DEFAULT_CFG, (16, 256, 4), (4, 1024, 4)])
def test_gpu_real_shapes(n, k, gated, cfg):
    check(n, k, gated, cfg, seed=n + k, dev="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("pdl", ["0", "1"])
def test_gpu_graph_replay_equals_eager_and_the_modes(pdl, monkeypatch):
    """Captured in a CUDA graph (PDL on and off) the GEMV gives eager's bits; the kernel object
    sends one token through it per NINFER_DENSE_GEMV and prefill rows to F.linear."""
    monkeypatch.setenv("NINFER_PDL", pdl)
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(5120, 17408, generator=g) * 0.02).to(torch.bfloat16).cuda()
    w2 = (torch.randn(5120, 6144, generator=g) * 0.02).to(torch.bfloat16).cuda()
    gu = torch.randn(1, 2 * 17408, generator=g).to(torch.bfloat16).cuda()
    x2 = torch.randn(1, 6144, generator=g).to(torch.bfloat16).cuda()
    eager = D.gemv(gu, w, gated=True)
    eager2 = D.gemv(x2, w2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        D.gemv(gu, w, gated=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = D.gemv(gu, w, gated=True)
        out2 = D.gemv(x2, w2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager) and torch.equal(out2, eager2)
    kern = D.DenseGemvKernel()
    monkeypatch.setenv("NINFER_DENSE_GEMV", "0")
    assert kern.apply_gated(gu, w) is None
    assert torch.equal(kern.apply(x2, w2), F.linear(x2, w2))
    monkeypatch.setenv("NINFER_DENSE_GEMV", "gated")
    assert torch.equal(kern.apply_gated(gu, w), eager)
    assert torch.equal(kern.apply(x2, w2), F.linear(x2, w2))
    monkeypatch.setenv("NINFER_DENSE_GEMV", "all")
    assert torch.equal(kern.apply(x2, w2), eager2)
    head = (torch.randn(65544, 256, generator=g) * 0.02).to(torch.bfloat16).cuda()  # past HEAD_ROWS, a tail of 8
    xh = torch.randn(1, 256, generator=g).to(torch.bfloat16).cuda()
    assert torch.equal(kern.apply(xh, head), D.gemv(xh, head))
    monkeypatch.setenv("NINFER_DENSE_GEMV", "body")
    assert torch.equal(kern.apply(x2, w2), eager2)
    assert torch.equal(kern.apply(xh, head), F.linear(xh, head))
    rows = torch.randn(3, 6144, generator=g).to(torch.bfloat16).cuda()
    assert torch.equal(kern.apply(rows, w2), F.linear(rows, w2))


def test_the_kernel_object_leaves_what_it_cannot_take_to_torch(monkeypatch):
    """Off the GPU, at more than one row, or with a weight whose rows are strided, apply is F.linear
    and apply_gated None (the caller runs SwiGLU), whatever NINFER_DENSE_GEMV says."""
    kern = D.DenseGemvKernel()
    g = torch.Generator().manual_seed(5)
    w = torch.randn(12, 16, generator=g)
    x = torch.randn(1, 16, generator=g)
    for m in ("0", "gated", "body", "all"):
        monkeypatch.setenv("NINFER_DENSE_GEMV", m)
        if not CUDA:
            assert torch.equal(kern.apply(x, w), F.linear(x, w))
            assert kern.apply_gated(torch.randn(1, 32, generator=g), w) is None
        if CUDA:
            wc, xc = w.cuda(), torch.randn(3, 16, generator=g).cuda()
            assert torch.equal(kern.apply(xc, wc), F.linear(xc, wc))
            wt = torch.randn(16, 12, generator=g).cuda().t()  # strided rows
            assert torch.equal(kern.apply(xc[:1], wt), F.linear(xc[:1], wt))
            assert kern.apply_gated(torch.randn(1, 32, generator=g).cuda(), wt) is None
