"""Batched rounds (one tensor step per round for the whole batch, ninfer.speculative) on the CPU:
the verify pass against plain decode steps (the torch reference and, interpreted, the fused
Triton kernels the GPU runs), the graph path's capture warm-up (a stand-in "graph" that runs
the warm-up and then the step eagerly), and the engine's use of it."""

from __future__ import annotations

import pytest
import torch
from spec_helpers import VOCAB, make_engine, params, prompt_ids

from ninfer.checkpoint import WeightSource, load_hf_config
from ninfer.device import probe
from ninfer.graphs import HistoryCounts
from ninfer.linear import LinearFactory
from ninfer.plugins import get_plugin_manager
from ninfer.testing import greedy_generate, make_tiny
from ninfer_plugins.spec_mtp.verify import HybridVerifier

CUDA = torch.cuda.is_available()
PROMPT = prompt_ids(30, seed=7)


def _model(path, device: str, dtype: torch.dtype, fused: bool):
    """The tiny checkpoint with the fast path's backends (fused: the Triton kernels, interpreted
    without CUDA) or the torch references."""
    from ninfer_plugins.cuda_fast.attention import FlashFullAttention
    from ninfer_plugins.cuda_fast.gdn import TritonLinearAttention
    from ninfer_plugins.qwen_hybrid.attention import ReferenceFullAttention
    from ninfer_plugins.qwen_hybrid.gdn import ReferenceLinearAttention
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    pm = get_plugin_manager()
    shape = pm.hook.ninfer_parse_config(hf_config=load_hf_config(path))
    backends = (FlashFullAttention(), TritonLinearAttention()) if fused else (ReferenceFullAttention(), ReferenceLinearAttention())
    m = QwenHybridModel(shape, LinearFactory(pm, probe(device), None), torch.device(device), dtype, *backends)
    m.load_weights(WeightSource(path))
    return m


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


@pytest.mark.parametrize("kind", ["reference fp32", "fused bf16", "fused bf16, rows one query each", "fused bf16, replay"])
def test_verify_rows_match_decode_steps_and_commit_picks_the_column(tmp_path, kind, monkeypatch):
    """B=2 sequences (slots 0 and 2 of 3) x M=3 verify rows against three plain decode steps from
    the same prefilled state; committing column A leaves the slot's GDN state after token A. The
    fused verify's attention takes each sequence's M queries in one program (T = M, grouped_meta),
    or with NINFER_ATTN_GROUPED=0 each row as its own query."""
    import ninfer_plugins.cuda_fast.attention as FA

    device = "cuda" if CUDA and kind.startswith("fused") else "cpu"
    fused = kind.startswith("fused")
    grouped, real = [], FA.grouped_meta
    monkeypatch.setattr(FA, "grouped_meta", lambda meta, m: grouped.append(m) or real(meta, m))
    if kind.endswith("each"):
        monkeypatch.setenv("NINFER_ATTN_GROUPED", "0")
    # replay: the GDN verify stores each token's update and the commit replays the accepted ones
    # (NINFER_GDN_REPLAY=1) instead of writing and copying state columns
    monkeypatch.setenv("NINFER_GDN_REPLAY", "1" if kind.endswith("replay") else "0")
    model = _model(make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4), device, torch.bfloat16 if fused else torch.float32, fused)
    assert model.graph_decode == fused
    dev = model.device
    caches = [model.allocate_cache(3, 64, "bf16") for _ in range(2)]
    lens = {0: 9, 2: 5}
    for cache in caches:
        for slot, n in lens.items():
            model.forward(torch.tensor(PROMPT[:n], device=dev), cache, slot, 0)
    slots = torch.tensor(list(lens), device=dev)
    starts = torch.tensor(list(lens.values()), device=dev)
    ids = torch.tensor([[11, 40, 7], [3, 99, 250]], device=dev)
    m = ids.shape[1]
    verifier = HybridVerifier(model, caches[0], m)
    pos = starts[:, None] + torch.arange(m, device=dev)
    hidden = verifier.forward(ids.reshape(-1), slots.repeat_interleave(m), pos.reshape(-1), slots, None if fused else 64)
    hidden = hidden.view(2, m, -1)
    assert grouped == ([m] if kind in ("fused bf16", "fused bf16, replay") else [])
    assert verifier._replayed == kind.endswith("replay")

    accepted = [1, 2]
    want_state = {}
    for t in range(m):
        h = model.decode(ids[:, t], caches[1], slots, starts + t, None if fused else 64)
        tol = 3e-2 if fused else 1e-4
        assert _rel(hidden[:, t], h) < tol, t
        for j, slot in enumerate(lens):
            if accepted[j] == t:
                want_state[slot] = [x[slot].clone() for x in caches[1].conv + caches[1].recurrent]
    before = [x[1].clone() for x in caches[0].conv + caches[0].recurrent]
    verifier.commit(slots, torch.tensor(accepted, device=dev))
    for slot, want in want_state.items():
        for got, w in zip([x[slot] for x in caches[0].conv + caches[0].recurrent], want):
            assert _rel(got, w) < (3e-2 if fused else 1e-4)
    # the slot between them is untouched
    for got, w in zip([x[1] for x in caches[0].conv + caches[0].recurrent], before):
        assert torch.equal(got, w)


class StandInGraphs:
    """What SpeculativeRound asks of the runner's GraphDecoder, with "capture" = run the warm-up,
    then hand back a replay that runs the step eagerly: the warm-up's two real rounds and its
    put-back are then exactly what the tokens see."""

    def __init__(self, num_slots: int, vocab: int) -> None:
        self.history = HistoryCounts(num_slots, vocab, torch.device("cpu"))
        self.graphs: dict = {}
        self.failed: set = set()

    def capture(self, key, step, warm_up=None):
        warm_up() if warm_up is not None else (step(), step())

        class Replay:
            def replay(self) -> None:
                step()

        self.graphs[key] = Replay()
        return self.graphs[key]


def _graph_engine(model, tok, k: int, **kw):
    eng = make_engine(model, tok, k=k, **kw)
    spec = eng.speculative
    fake = StandInGraphs(spec.cache.num_slots, spec.vocab)
    spec.graphs, spec.history, spec.eager_reason = fake, fake.history, None
    return eng, fake


def test_the_capture_warm_up_puts_back_what_it_moved(dense, tok):
    k = 3
    ref = greedy_generate(dense, PROMPT, 40)
    eng, fake = _graph_engine(dense, tok, k, max_batch=3)
    sampled = params(max_new_tokens=30, temperature=0.9, top_k=8, presence_penalty=0.8, frequency_penalty=0.3, seed=3)
    rids = [eng.add_request(PROMPT, params(max_new_tokens=40)), eng.add_request(prompt_ids(12, seed=1), sampled)]
    got = {r: [] for r in rids}
    while eng.has_unfinished():
        for o in eng.step():
            got[o.request_id] += o.new_token_ids
    assert got[rids[0]] == ref
    assert any(key[0] == "spec" for key in fake.graphs)
    # the sampled request with penalties: the same tokens as the eager batched path
    eager = make_engine(dense, tok, k=k, max_batch=3)
    assert eager.speculative.batched and eager.speculative.eager_reason is not None
    eager.add_request(PROMPT, params(max_new_tokens=40))
    assert eager.generate(prompt_ids(12, seed=1), sampled).new_token_ids == got[rids[1]]


def test_engine_rounds_are_batched_and_counted(dense, tok):
    eng = make_engine(dense, tok, k=3, max_batch=2)
    spec = eng.speculative
    assert spec.batched and spec.graphs is None and spec.verifier is not None
    out = eng.generate(PROMPT, params(max_new_tokens=20))
    s = out.stats["spec"]
    assert s["rounds"] > 0 and s["drafted"] == 3 * s["rounds"] and sum(s["accepted_per_position"]) == s["accepted"]


def test_the_mtp_layer_runs_the_targets_fused_small_ops(tmp_path):
    """The drafter's MTP layer is built after the model: it must still take the model's fused
    norms and SwiGLU (one launch each, not ~8 torch ops a norm), and give what the torch ops give."""
    from ninfer_plugins.qwen_hybrid.layers import TORCH_OPS, DecoderLayer, SwiGLU
    from ninfer_plugins.spec_mtp.mtp import MtpCache, MtpLayer

    device = "cuda" if CUDA else "cpu"
    model = _model(make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4), device, torch.bfloat16, True)
    assert model.ops.name == "triton"
    layer = MtpLayer(model)
    layer.load(model)
    subs = [m for m in layer.modules() if isinstance(m, (DecoderLayer, SwiGLU))]
    assert subs and all(m.ops is model.ops for m in subs) and layer.ops is model.ops
    dev = model.device
    ids, slots, pos = torch.tensor([5, 9], device=dev), torch.tensor([0, 1], device=dev), torch.tensor([3, 7], device=dev)
    hidden = torch.randn(2, model.shape.hidden_size, generator=torch.Generator().manual_seed(0)).to(dev, torch.bfloat16)
    fused = layer.decode(model, ids, hidden, MtpCache(model.shape, 2, 16, model.dtype, dev), slots, pos, None)
    for m in [layer, *subs]:
        m.ops = TORCH_OPS
    plain = layer.decode(model, ids, hidden, MtpCache(model.shape, 2, 16, model.dtype, dev), slots, pos, None)
    assert _rel(fused, plain) < 3e-2


def test_the_mtp_alignment_groups_each_sequences_queries(tmp_path, monkeypatch):
    """The round's alignment (`align_seeds(..., columns=M)`) on the fused backend takes each
    sequence's M queries in one attention program (grouped_meta), like the target's verify: the
    seed rows agree with each row its own query, and every column's K/V is written alike."""
    import ninfer_plugins.cuda_fast.attention as FA
    from ninfer_plugins.spec_mtp.mtp import MtpDrafter

    device = "cuda" if CUDA else "cpu"
    model = _model(make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4), device, torch.bfloat16, True)
    dev, h = model.device, model.shape.hidden_size
    gen = torch.Generator().manual_seed(3)
    b, m = 2, 4
    slots = torch.tensor([2, 0], device=dev).repeat_interleave(m)
    positions = torch.tensor([9, 17], device=dev)[:, None].add(torch.arange(m, device=dev)).reshape(-1)
    ids = torch.randint(0, VOCAB, (b * m,), generator=gen).to(dev)
    hidden = torch.randn(b * m, h, generator=gen).to(dev, torch.bfloat16)
    keep = torch.tensor([1, m + 3], device=dev)
    grouped, real = [], FA.grouped_meta
    monkeypatch.setattr(FA, "grouped_meta", lambda meta, cols: grouped.append(cols) or real(meta, cols))
    outs, kvs = [], []
    for mode in ("1", "0"):
        monkeypatch.setenv("NINFER_ATTN_GROUPED", mode)
        drafter = MtpDrafter(model, 3, 64, 3)
        for slot, n in ((2, 9), (0, 17)):  # history before the columns
            g = torch.Generator().manual_seed(slot)
            drafter.align(slot, torch.randint(0, VOCAB, (n,), generator=g).to(dev),
                          torch.randn(n, h, generator=g).to(dev, torch.bfloat16), 0)
        outs.append(drafter.align_seeds(slots, ids, hidden, positions, None, keep, columns=m))
        kvs.append((drafter.cache.k.clone(), drafter.cache.v.clone()))
    assert grouped == [m]
    assert _rel(outs[0], outs[1]) < 3e-2
    assert all(torch.equal(a, b_) for a, b_ in zip(kvs[0], kvs[1]))


def test_rounds_with_the_gdn_replay_commit_and_a_cut_round(tmp_path, tok, monkeypatch):
    """NINFER_GDN_REPLAY=1 (the verify stores each token's update, the commit replays the kept
    ones on the slot's state) on the fused backend: the same greedy tokens as the state columns,
    rounds cut by a length limit included. A cut can no longer move the slot back (the commit
    replayed in place), so it is refused for a request that goes on, and allowed for one that
    ends there (its slot is reset before reuse)."""
    from types import SimpleNamespace

    from spec_helpers import ScriptedDrafter

    model = _model(make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4), "cuda" if CUDA else "cpu",
                   torch.bfloat16, True)
    # drafts of the known greedy continuation, right for a scripted count of each round (the tiny
    # model's own MTP drafts are never accepted: every round would keep one token, and none be cut)
    ref = greedy_generate(model, PROMPT, 24)
    got, cuts = {}, {}
    for mode in ("0", "1"):
        monkeypatch.setenv("NINFER_GDN_REPLAY", mode)
        eng = make_engine(model, tok, drafter=ScriptedDrafter(PROMPT + ref, 3), max_batch=2)
        spec = eng.speculative
        real, cuts[mode] = spec.truncate, []
        monkeypatch.setattr(spec, "truncate", lambda r, slot, kept: cuts[mode].append(kept) or real(r, slot, kept))
        got[mode] = eng.generate(PROMPT, params(max_new_tokens=19)).new_token_ids  # the last round cut
        assert spec.verifier.replayed == (mode == "1")
    assert got["1"] == got["0"] and cuts["1"] and cuts["1"] == cuts["0"]
    assert spec._last[0][1] is None  # slot 0's last round was a batched one
    with pytest.raises(RuntimeError, match="replayed in place"):
        real(SimpleNamespace(id="x", finished=False), 0, 1)
