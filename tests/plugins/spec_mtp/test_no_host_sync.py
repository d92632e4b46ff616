"""The steps ninfer captures in CUDA graphs read nothing on the host: a speculative round
(`SpeculativeRound._round_step(b, None, None)`, the captured form) and the plain decode step
(`GraphDecoder._step`), watched by `host_reads.no_host_reads` while they run on the CPU.

A GPU captures them only on the fused path (bf16 with the cuda_fast backends: `graphs_supported`
refuses otherwise), so the tests that matter run those kernels interpreted (TRITON_INTERPRET=1),
through the engine with a stand-in for the runner's graphs whose "replay" runs the captured
step under the watch: the inputs are written exactly as before a real replay. The dense round
takes about 16 s and the decode step 5 s on CI's CPU; the shortlist-head round and the MoE
model (35 s) are `slow`. The reference tests run the same steps on the fp32 reference cores in
a second and check that their only host reads are the reference cores' own (their attention's
length read, `max_len` being None), which also guards the round and the decode step."""

from __future__ import annotations

import pytest
import torch
from host_reads import no_host_reads
from spec_helpers import VOCAB, make_engine, params, prompt_ids

from ninfer.graphs import GraphDecoder

# where the reference cores read a length on the host (never captured: they are not graph-safe)
REFERENCE_CORES = ("plugins/qwen_hybrid/attention.py", "plugins/qwen_hybrid/gdn.py")
SAMPLED = dict(temperature=0.9, top_k=8, presence_penalty=0.8, frequency_penalty=0.3, seed=3)


def _fused_model(path):
    """The tiny checkpoint in bf16 on the fast path's backends (their Triton kernels interpreted),
    which is what a GPU captures."""
    from ninfer.checkpoint import WeightSource, load_hf_config
    from ninfer.device import probe
    from ninfer.linear import LinearFactory
    from ninfer.plugins import get_plugin_manager
    from ninfer_plugins.cuda_fast.attention import FlashFullAttention
    from ninfer_plugins.cuda_fast.gdn import TritonLinearAttention
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    pm = get_plugin_manager()
    shape = pm.hook.ninfer_parse_config(hf_config=load_hf_config(path))
    factory = LinearFactory(pm, probe("cpu"), None)
    m = QwenHybridModel(shape, factory, torch.device("cpu"), torch.bfloat16, FlashFullAttention(), TritonLinearAttention())
    m.load_weights(WeightSource(path))
    assert m.graph_decode
    return m


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    from ninfer.testing import make_tiny

    return _fused_model(make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("fused"), vocab=VOCAB, layers=4))


class WatchedGraphs:
    """The runner's graphs as the round and the decoder use them, where capturing hands back a
    "replay" that runs the captured step once under `no_host_reads` (no warm-up: it is not
    captured). `reads` gathers every read of every replay; `replays` counts them per key."""

    def __init__(self) -> None:
        self.graphs: dict = {}
        self.failed: set = set()
        self.reads: dict = {}
        self.replays: dict = {}
        self.callers: set = set()  # the repository files whose torch calls the replays made

    def capture(self, key, step, warm_up=None):
        watched = self

        class Replay:
            def replay(self) -> None:
                with no_host_reads(check=False) as watch:
                    step()
                watched.reads.update(watch.reads)
                watched.callers |= watch.caller_files()
                watched.replays[key] = watched.replays.get(key, 0) + 1

        self.graphs[key] = Replay()
        return self.graphs[key]


def _report(reads: dict) -> str:
    return "\n".join(f"  {op} at {chain}" for op, chain in sorted(reads))


def _outside(reads: dict, allowed: tuple[str, ...]) -> dict:
    return {key: site for key, site in reads.items() if not site.startswith(allowed)}


def _rounds(model, tok, k: int, want: set, **kw) -> WatchedGraphs:
    """Two requests (one greedy, one sampled with penalties) through an engine whose rounds take
    the graph path, until a round of each batch size in `want` has been replayed."""
    eng = make_engine(model, tok, k=k, max_batch=2, max_context=64, **kw)
    spec = eng.speculative
    assert spec.batched
    watched = WatchedGraphs()
    spec.graphs, spec.eager_reason = watched, None  # the history stays the round's own
    watched.drafter = spec.drafter
    eng.add_request(prompt_ids(6, seed=1), params(max_new_tokens=12))
    eng.add_request(prompt_ids(5, seed=2), params(max_new_tokens=12, **SAMPLED))
    while eng.has_unfinished() and not want <= {b for _, b in watched.replays}:
        eng.step()
    assert want <= {b for _, b in watched.replays}, watched.replays
    return watched


def _decode_steps(model, tok, buckets: list[int]) -> tuple[WatchedGraphs, set]:
    """Two requests through a plain engine whose decode steps take GraphDecoder (its buckets
    `buckets`), until it has decoded batches of 1 and 2. -> (graphs, batch sizes decoded)."""
    eng = make_engine(model, tok, max_batch=2, max_context=64)
    decoder = GraphDecoder(model, eng.runner.cache, 2)
    decoder.buckets = buckets
    watched = WatchedGraphs()
    decoder.capture = watched.capture
    decoder.graphs, decoder.failed = watched.graphs, watched.failed
    sizes = set()
    launch = decoder.launch

    def counting(requests, ahead=False):
        sizes.add(len(requests))
        return launch(requests, ahead)

    decoder.launch = counting
    eng.runner.graphs = decoder
    eng.add_request(prompt_ids(6, seed=1), params(max_new_tokens=6))
    eng.add_request(prompt_ids(5, seed=2), params(max_new_tokens=6, **SAMPLED))
    while eng.has_unfinished() and sizes != {1, 2}:
        eng.step()
    assert sizes == {1, 2} and watched.replays, (sizes, watched.replays)
    return watched, sizes


# --- the watch itself ---------------------------------------------------------------------------


def test_the_watch_sees_each_kind_of_host_read_and_lets_interpreted_kernels_run():
    from ninfer.kernels.triton import rmsnorm

    x, s = torch.arange(6.0), torch.tensor(2)
    with no_host_reads(check=False) as watch:
        int(s), float(s), bool(s), [0, 1, 2][s], s.item(), x.tolist(), x.cpu(), x.numpy()
        x[x > 1], torch.nonzero(x), torch.unique(x), torch.where(x > 1), torch.tensor([1, 2], device="cpu")
        torch.repeat_interleave(x, s.expand(6))
        x.repeat_interleave(2, dim=0)  # an int count: expand + reshape, no read
        torch.arange(3)
        # a Triton kernel, interpreted: its own tensor traffic is the emulated GPU's
        rmsnorm(torch.randn(4, 64, dtype=torch.bfloat16, device="cpu"), torch.zeros(64, device="cpu"), 1e-6)
    reads = watch.reads
    ops = {op for op, _ in reads}
    for want in ("__int__", "__float__", "__bool__", "__index__", "item", "tolist", "cpu", "numpy", "boolean-mask index",
                 "nonzero", "unique", "where(condition) (a nonzero)", "torch.tensor(<python data>)",
                 "repeat_interleave(tensor repeats) without output_size", "torch.arange without device="):  # fmt: skip
        assert want in ops, (want, ops)
    assert not any("self_int" in op or "rmsnorm" in chain or "triton" in chain for op, chain in reads), _report(reads)
    assert "core/kernels/triton/norms.py" in watch.caller_files()
    with pytest.raises(AssertionError, match="item at"):
        with no_host_reads():
            s.item()


# --- the reference cores (CI) -------------------------------------------------------------------


def test_reference_round_reads_only_in_the_reference_cores(dense, tok):
    watched = _rounds(dense, tok, 2, {1, 2})
    assert watched.reads, "the reference attention reads its length on the host: the watch saw nothing"
    outside = _outside(watched.reads, REFERENCE_CORES)
    assert not outside, "host reads in the round's own code:\n" + _report(outside)


def test_reference_decode_step_reads_only_in_the_reference_cores(dense, tok):
    # exact buckets: the reference cores have no padding rows (slot -1 would index the last slot)
    watched, _ = _decode_steps(dense, tok, [1, 2])
    assert watched.reads
    outside = _outside(watched.reads, REFERENCE_CORES)
    assert not outside, "host reads in the decode step's own code:\n" + _report(outside)


@pytest.mark.parametrize("tail,sampler", [("in the sampler", "reference"), ("in the sampler", "fused"),
                                          ("torch ops", "reference")])
def test_graph_decode_steps_give_the_eager_steps_tokens(dense, tok, tail, sampler, monkeypatch):
    """GraphDecoder's step (the sampler counts its tokens into the history and writes them out
    itself, in torch or in the fused sampler's kernels, interpreted; NINFER_STEP_TAIL=0: torch ops
    after it) against the engine's eager decode steps: the same tokens for a greedy request and
    one sampled with strong penalties, batched, finishing at different lengths."""
    from ninfer_plugins.cuda_fast.sampler import TritonSampler

    monkeypatch.setenv("NINFER_STEP_TAIL", "1" if tail == "in the sampler" else "0")

    def run(graph: bool) -> list[list[int]]:
        eng = make_engine(dense, tok, max_batch=2, max_context=64)
        if graph:
            decoder = GraphDecoder(dense, eng.runner.cache, 2, sampler=TritonSampler() if sampler == "fused" else None)
            decoder.buckets = [1, 2]
            watched = WatchedGraphs()
            decoder.capture = watched.capture
            decoder.graphs, decoder.failed = watched.graphs, watched.failed
            eng.runner.graphs = decoder
        ids = [eng.add_request(prompt_ids(6, seed=1), params(max_new_tokens=6)),
               eng.add_request(prompt_ids(5, seed=2), params(max_new_tokens=10, **{
                   **SAMPLED, "presence_penalty": 2.0, "frequency_penalty": 2.0, "top_k": 3}))]  # fmt: skip
        got = {i: [] for i in ids}
        while eng.has_unfinished():
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
        if graph:
            assert watched.replays, "no graph step ran"
        return [got[i] for i in ids]

    assert run(True) == run(False)


# --- the fused path a GPU captures (interpreted) ------------------------------------------------


# the fused kernels' wrappers: the watch saw them called, so the fused path is what ran
FUSED = {"core/kernels/triton/attention.py", "core/kernels/triton/gdn.py", "core/kernels/triton/rope.py"}
# a round also does its bookkeeping in Triton launches
FUSED_ROUND = FUSED | {"core/kernels/triton/spec_round.py"}


@pytest.mark.parametrize("lm_head_draft", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_fused_round_step_reads_nothing_on_the_host(fused, tok, lm_head_draft):
    watched = _rounds(fused, tok, 2, {1, 2}, lm_head_draft=lm_head_draft)
    assert FUSED_ROUND <= watched.callers, watched.callers
    assert not watched.reads, "host reads in the captured round:\n" + _report(watched.reads)


def test_round_bookkeeping_kernels_and_grouped_sampling_keep_the_tokens(fused, tok, monkeypatch):
    """The round's first and last bookkeeping as Triton launches (`spec_round`) and the fused
    sampler's per-sequence parameters (group = K+1) give the same tokens as the torch ops
    (NINFER_ROUND_IO=0, the reference sampler): a greedy request and a sampled one with
    penalties, batched, rounds run eagerly through the fused kernels."""
    from ninfer.engine import LLMEngine
    from ninfer.kernels.sampling import ReferenceSampler
    from ninfer_plugins.cuda_fast.sampler import TritonSampler

    def run(fused_io: bool) -> list[list[int]]:
        monkeypatch.setenv("NINFER_ROUND_IO", "1" if fused_io else "0")
        ref = make_engine(fused, tok, k=2, max_batch=2, max_context=64)
        sampler = TritonSampler() if fused_io else ReferenceSampler()
        eng = LLMEngine(fused, ref.runner.cache, sampler, tok, max_context=64, prefill_chunk=1024, max_batch=2,
                        speculator=ref.speculative.drafter)  # fmt: skip
        assert eng.speculative.batched and eng.speculative._fused_io == fused_io
        calls, step = [], eng.speculative._round_step
        eng.speculative._round_step = lambda *a: calls.append(a) or step(*a)
        ids = [eng.add_request(prompt_ids(6, seed=1), params(max_new_tokens=3)),
               eng.add_request(prompt_ids(5, seed=2), params(max_new_tokens=4, **SAMPLED))]  # fmt: skip
        got = {i: [] for i in ids}
        while eng.has_unfinished():
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
        assert calls, "no batched round ran"
        return [got[i] for i in ids]

    assert run(True) == run(False)


def test_fused_decode_step_reads_nothing_on_the_host(fused, tok):
    # one bucket of 2: a batch of 1 runs with a padding row (slot -1), as past EXACT_UP_TO
    watched, _ = _decode_steps(fused, tok, [2])
    assert FUSED <= watched.callers, watched.callers
    assert not watched.reads, "host reads in the captured decode step:\n" + _report(watched.reads)


@pytest.mark.slow
def test_fused_int8_kv_round_and_decode_step_read_nothing_on_the_host(tmp_path, tok):
    """The INT8-G64 KV cache: the quantizing append and the int8 split-K kernel."""
    from ninfer.testing import make_tiny

    model = _fused_model(make_tiny("qwen3.6-27b", tmp_path, vocab=VOCAB, layers=4))
    allocate = model.allocate_cache
    model.allocate_cache = lambda slots, context, kv_dtype="bf16": allocate(slots, context, "int8")
    assert model.allocate_cache(1, 8).kv_scales(0) is not None
    watched = _rounds(model, tok, 2, {1, 2})
    assert FUSED <= watched.callers, watched.callers
    assert not watched.reads, "host reads in the captured round:\n" + _report(watched.reads)
    watched, _ = _decode_steps(model, tok, [2])
    assert not watched.reads, "host reads in the captured decode step:\n" + _report(watched.reads)


@pytest.mark.slow
def test_fused_moe_round_and_decode_step_read_nothing_on_the_host(tmp_path, tok):
    """The 35B-A3B shape on the grouped Triton MoE (graph_safe), MTP layer included. decode_max 1
    sends every step of more than one row through the MoE's prefill plan (torch sort and scans),
    which a GPU takes past 16 rows (verify rows are B * (K+1))."""
    from ninfer import hookimpl
    from ninfer.device import ANYWHERE
    from ninfer.plugins import get_plugin_manager
    from ninfer.testing import make_tiny
    from ninfer_plugins.moe_triton.moe import TritonMoe
    from ninfer_plugins.qwen_hybrid.layers import SparseMoe

    class ForcedTritonMoe:
        @hookimpl(tryfirst=True)
        def ninfer_moe_kernel(self, scheme_gate_up, scheme_down, device, num_experts, hidden, inner):
            return TritonMoe(requirements=ANYWHERE, fused_dtypes=(torch.bfloat16,), decode_max=1)

    pm = get_plugin_manager()
    pm.register(ForcedTritonMoe(), name="forced_triton_moe")
    try:
        model = _fused_model(make_tiny("qwen3.6-35b-a3b", tmp_path, vocab=VOCAB, seed=2, layers=4))
        watched = _rounds(model, tok, 2, {1, 2})
    finally:
        pm.unregister("forced_triton_moe")
    moes = [m for mod in (model, watched.drafter.layer) for m in mod.modules() if isinstance(m, SparseMoe)]
    assert moes and all(isinstance(m.experts.kernel, TritonMoe) for m in moes)
    assert "plugins/moe_triton/moe.py" in watched.callers, watched.callers
    assert not watched.reads, "host reads in the captured round:\n" + _report(watched.reads)
    watched, _ = _decode_steps(model, tok, [2])
    assert not watched.reads, "host reads in the captured decode step:\n" + _report(watched.reads)


def test_decode_steps_launched_ahead_through_the_graph_decoder(fused, tok, monkeypatch):
    """NINFER_LOOKAHEAD=1 through GraphDecoder.launch(ahead=True), its replays run eagerly here:
    ids copied on the device from the previous replay's tokens, no history sync (the counts
    already hold the previous token), tokens read through the two host buffers. The same tokens
    as plain graph steps, for a greedy request and one sampled with penalties that start apart
    and finish at different lengths (the batch changes under a step run ahead)."""

    def run(lookahead: bool) -> tuple[list, int]:
        monkeypatch.setenv("NINFER_LOOKAHEAD", "1" if lookahead else "0")
        eng = make_engine(fused, tok, max_batch=2, max_context=64)
        decoder = GraphDecoder(fused, eng.runner.cache, 2)
        watched = WatchedGraphs()
        decoder.capture = watched.capture
        decoder.graphs, decoder.failed = watched.graphs, watched.failed
        eng.runner.graphs = decoder
        aheads = []
        launch = decoder.launch

        def counting(requests, ahead=False):
            aheads.append(ahead)
            wait = launch(requests, ahead)
            for r in requests:
                # the counts row holds every token through the one this step sampled (output ids,
                # the previous step's token not yet appended, and this step's)
                held = int(decoder.counts[r.slot].sum())
                assert held == len(r.output_ids) + 1 + int(ahead), (r.id, held, len(r.output_ids), ahead)
            return wait

        decoder.launch = counting
        a = eng.add_request(prompt_ids(6, seed=1), params(max_new_tokens=7))
        got = {a: []}
        for _ in range(3):
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
        # strong penalties over a longer run: the history a step sees decides its token
        b = eng.add_request(prompt_ids(5, seed=2), params(max_new_tokens=10, **{
            **SAMPLED, "temperature": 0.2, "presence_penalty": 2.0, "frequency_penalty": 2.0, "top_k": 2}))
        got[b] = []
        while eng.has_unfinished():
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
        return [got[a], got[b]], sum(aheads)

    plain, none = run(False)
    ahead, launched = run(True)
    assert none == 0 and launched > 0
    assert ahead == plain and [len(t) for t in plain] == [7, 10]
