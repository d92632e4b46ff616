"""`ninfer bench`: prefill and decode speed of one configuration, against the memory roofline.

    ninfer bench --model ID --quant Q [--random-weights] [--prompt-len N] [--gen-len M]
                 [--context-len L] [--concurrency C] [--spec mtp --draft-tokens K]
                 [--compare-transformers] [--json FILE]

What it does, in one process:
1. measures the device-to-device copy bandwidth (bytes read + written): the roofline's rate;
2. builds the model through the plugin hooks (with --random-weights: full size, directly on the
   device, in the --quant format) and its cache for C sequences of max_context positions;
3. prefills C prompts of N random token ids with the engine's Runner (one warm-up prefill first,
   so kernel compilation is not timed), in chunks of --prefill-chunk (default: the whole prompt,
   up to 8192 tokens). With --context-len L > N the first L - N positions of each sequence get
   random K/V instead of a prefill (`fill_random` of the cache): decode at a long context
   without paying for its prefill; the step's time does not depend on the values;
4. decodes M tokens (greedy, stop tokens ignored) with the Runner (CUDA graphs unless
   --no-cuda-graph); the first steps capture graphs and are not timed;
5. reports tok/s, ms per step, the bytes one step must read (every weight once, of an MoE
   layer's routed experts only those the step selects, the K/V of every full-attention layer up
   to each row's position, the recurrent and conv state read and written), the roofline time
   (bytes / copy bandwidth) and the step's share of it, and the peak device memory while
   serving (weights + cache + activations; the transient of building random weights is reported
   apart).
6. with --spec (mtp): prefills the same prompts again with the drafter aligned, then times as many
   speculative rounds (CUDA graphs unless --no-cuda-graph) as plain steps were timed: ms per round
   against ms per plain step of step 4, rounds/s, the captured round's and its verify pass's
   device time, acceptance per draft position, and the projected tok/s at the peer's published
   per-position acceptance (73% long reasoning, 88% structured): rounds/s x concurrency x
   sum_{i=0..K} a^i, a projection, since random weights accept next to nothing.
With --compare-transformers (bf16): transformers' own Qwen3_5ForCausalLM built on the same weight
tensors (shared, not copied), its decode timed on the same prompt, and the ratio.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Any

import structlog
import torch

from ninfer.errors import UserError
from ninfer.kernels.epoch import new_epoch

log = structlog.get_logger("ninfer.bench")

GIB = 2**30
WARMUP_STEPS = 2


@dataclasses.dataclass
class BenchOptions:
    prompt_len: int = 512
    gen_len: int = 128
    context_len: int | None = None
    concurrency: int = 1
    compare_transformers: bool = False
    compare_gen_len: int = 8
    seed: int = 0

    def check(self) -> None:
        if self.prompt_len < 1:
            raise UserError(f"--prompt-len must be at least 1, got {self.prompt_len}.")
        if self.gen_len < WARMUP_STEPS + 2:
            raise UserError(f"--gen-len must be at least {WARMUP_STEPS + 2} (the first steps warm up), got {self.gen_len}.")
        if self.concurrency < 1:
            raise UserError(f"--concurrency must be at least 1, got {self.concurrency}.")
        if self.context_len is not None and self.context_len < self.prompt_len:
            raise UserError(f"--context-len {self.context_len} is shorter than --prompt-len {self.prompt_len}.")


# --- measurements --------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read plus written."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        n = int(min(2 * GIB, free // 4))
        src = torch.empty(n, dtype=torch.uint8, device=device).random_()
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        times = []
        for _ in range(10):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            dst.copy_(src)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1000)
        del src, dst
        torch.cuda.empty_cache()
        return 2 * n / statistics.median(times)
    n = 256 * 2**20
    src = torch.ones(n, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * n / statistics.median(times)


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(x) for x in obj)
    if dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        return sum(_tensor_bytes(v) for v in vars(obj).values() if isinstance(v, (torch.Tensor, list, tuple)))
    return 0


def experts_read(num_experts: int, top_k: int, rows: int) -> float:
    """Distinct experts `rows` tokens route to in one MoE layer: exactly top_k for one row; for
    more, the expectation when each row picks top_k of num_experts uniformly (random weights)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** rows)


def moe_banks(model: Any) -> list[tuple[Any, int]]:
    """(expert bank, top_k) of each sparse-MoE layer: a bank is the module holding `moe_prepared`
    (hookspecs' ninfer_moe_kernel) with its experts' QLinears in `gate_up` / `down`."""
    return [
        (m.experts, int(m.top_k))
        for m in model.modules()
        if hasattr(getattr(m, "experts", None), "moe_prepared") and getattr(m, "top_k", 0)
    ]


def moe_read(model: Any, rows: int) -> dict[str, Any] | None:
    """What one decode step of `rows` sequences reads of the routed experts (None: no MoE layer).
    A step reads each expert it selects once, whatever number of rows chose it, and no other."""
    banks = moe_banks(model)
    if not banks:
        return None
    all_bytes = read = 0.0
    per_layer = []
    for bank, top_k in banks:
        held = sum(_tensor_bytes(q.prepared) for q in (*bank.gate_up, *bank.down) if q.prepared is not None)
        if not held:  # the MoE kernel keeps the only copy
            held = getattr(bank.moe_prepared, "bytes_per_expert", 0) * bank.num_experts
        used = experts_read(bank.num_experts, top_k, rows)
        per_layer.append(used)
        all_bytes += held
        read += held * used / bank.num_experts
    return {
        "layers": len(banks),
        "experts": banks[0][0].num_experts,
        "top_k": banks[0][1],
        "experts_read_per_layer": round(statistics.mean(per_layer), 2),
        "routed_bytes_read": int(read),
        "routed_bytes_all": int(all_bytes),
    }


def weight_bytes_read(model: Any, rows: int) -> int:
    """Bytes of weights one decode step of `rows` sequences reads: every linear once, in the layout
    its kernel reads, except the routed experts of MoE layers, of which only those the step
    selects (`moe_read`); every small buffer (norms, conv taps, gates), and the embedding rows
    (the whole table when the head is tied to it)."""
    from ninfer.linear import QLinear

    experts = {id(q) for bank, _ in moe_banks(model) for q in (*bank.gate_up, *bank.down)}
    routed = moe_read(model, rows)
    total = routed["routed_bytes_read"] if routed else 0
    for m in model.modules():
        if isinstance(m, QLinear) and m.prepared is not None and id(m) not in experts:
            total += _tensor_bytes(m.prepared)
    for name, buf in model.named_buffers():
        if name == "embed_tokens" or name.endswith(".embed_tokens"):
            tied = getattr(model, "lm_head", 0) is None
            total += _tensor_bytes(buf) if tied else rows * buf.shape[1] * buf.element_size()
        else:
            total += _tensor_bytes(buf)
    return total


def _peak_gib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: KiB
    except Exception:  # noqa: BLE001 - not a number we can read here
        return None


# --- the run ---------------------------------------------------------------------------------------


def build(p: Any, plugins: Any) -> Any:
    """The model of plan `p` (from `ninfer.startup.plan`): its weights, or random ones."""
    weights = None
    if p.path is not None:
        weights = plugins.hook.ninfer_load_weights(path=str(p.path), shape=p.shape, config=p.config, device=p.device)
    model = plugins.hook.ninfer_model(shape=p.shape, config=p.config, device=p.device, weights=weights)
    if model is None:
        raise UserError(f"No installed plugin builds the {p.shape.family} family.")
    return model


def run(config: Any, opts: BenchOptions, plugins: Any = None, model: Any = None) -> dict[str, Any]:
    """One benchmark. `model`: one built earlier in this process for the same --model, --quant and
    --dtype (a campaign that times several contexts builds the weights once); None builds it."""
    from ninfer.cache import StateSlots
    from ninfer.config import SamplingParams
    from ninfer.plugins import get_plugin_manager
    from ninfer.request import Request
    from ninfer.runner import Runner
    from ninfer.scheduler import DecodeBatch, PrefillChunk
    from ninfer.startup import plan

    opts.check()
    plugins = plugins or get_plugin_manager()
    # a reused model's weights are on the card already and would be counted twice by the plan
    # (the bf16 27B, 50 GiB, was refused on an 80 GiB H100 with 15 GiB "free"): what this process's
    # allocator holds is credited back
    mdev = torch.device(getattr(model, "device", "cpu")) if model is not None else None
    held = torch.cuda.memory_reserved(mdev) if mdev is not None and mdev.type == "cuda" else 0
    p = plan(config, plugins=plugins, held_bytes=held)
    config = p.config  # --prefill-chunk 0 (the default's marker) resolved
    device = torch.device(p.device.torch_device)
    context = opts.context_len or opts.prompt_len
    prefix = context - opts.prompt_len
    if context + opts.gen_len > config.max_context:
        raise UserError(
            f"--context-len {context} plus --gen-len {opts.gen_len} needs --max-context {context + opts.gen_len}, "
            f"got {config.max_context}."
        )

    bandwidth = copy_bandwidth(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    reused = model is not None
    if model is None:
        model = build(p, plugins)
    cache = model.allocate_cache(opts.concurrency, config.max_context, config.kv_dtype)
    if prefix and not hasattr(cache, "fill_random"):
        raise UserError("--context-len longer than --prompt-len needs a cache that can fill random K/V; drop --context-len.")
    _sync(device)
    build_s = time.perf_counter() - t0
    peak_build = _peak_gib(device)
    resident = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runner = Runner(model, cache, p.choices[0].impl, cuda_graph=config.cuda_graph, max_batch=opts.concurrency)
    slots = StateSlots(cache)

    gen = torch.Generator().manual_seed(opts.seed)
    vocab = p.shape.vocab_size
    params = SamplingParams(temperature=0.0, max_new_tokens=opts.gen_len, ignore_eos=True)
    requests = []
    for i in range(opts.concurrency):
        r = Request(f"bench-{i}", torch.randint(0, vocab, (context,), generator=gen).tolist(), params)
        r.slot = slots.allocate(r.id)
        requests.append(r)

    def prefill(r: Request) -> int:
        r.num_computed = prefix
        token = None
        for start in range(prefix, context, config.prefill_chunk):
            token = runner.prefill(PrefillChunk(r, start, min(start + config.prefill_chunk, context)))
        return token

    # warm-up: compiles every prefill kernel at these shapes; then the slot starts over
    for r in requests:
        if prefix:
            cache.fill_random(r.slot, prefix, seed=opts.seed)
    prefill(requests[0])
    cache.reset(requests[0].slot)
    _sync(device)
    t0 = time.perf_counter()
    for r in requests:
        r.output_ids.append(prefill(r))
    _sync(device)
    prefill_s = time.perf_counter() - t0
    first_token = requests[0].output_ids[0]

    batch = DecodeBatch(requests)

    def step() -> None:
        for r, t in zip(requests, runner.decode(batch)):
            r.output_ids.append(t)

    # the last warm-up step launches nothing ahead (NINFER_LOOKAHEAD): the timed loop then runs
    # exactly `steps` steps on the GPU, its first one not already done before the clock starts
    lookahead = runner.lookahead
    for i in range(WARMUP_STEPS):
        runner.lookahead = lookahead and i < WARMUP_STEPS - 1
        step()
    runner.lookahead = lookahead
    start_ctx = requests[0].num_computed
    steps = opts.gen_len - 1 - WARMUP_STEPS
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    decode_s = time.perf_counter() - t0
    end_ctx = requests[0].num_computed
    replay_ms = _replay_ms(runner, opts.concurrency)

    ms_step = 1000 * decode_s / steps
    shape = p.shape
    avg_ctx = (start_ctx + end_ctx + 1) / 2  # keys read per row per step, averaged over the timed steps
    kv_elem = shape.kv_bytes_per_token(config.kv_dtype) * (2 if model.dtype == torch.float32 and config.kv_dtype == "bf16" else 1)
    try:
        state = shape.state_bytes_per_sequence(conv_bytes=torch.finfo(model.dtype).bits // 8)
    except TypeError:
        state = shape.state_bytes_per_sequence()
    nbytes = {
        "weights": weight_bytes_read(model, opts.concurrency),
        "kv": int(kv_elem * avg_ctx * opts.concurrency),
        "state": 2 * state * opts.concurrency,  # read and written back
    }
    nbytes["total"] = sum(nbytes.values())
    routed = moe_read(model, opts.concurrency)
    roofline_ms = 1000 * nbytes["total"] / bandwidth
    result: dict[str, Any] = {
        "command": "ninfer bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": p.device.describe(),
        "versions": {"torch": torch.__version__, "python": platform.python_version(), **_versions()},
        "config": {
            "model": p.model_name,
            "quant": config.quant,
            "kv_dtype": config.kv_dtype,
            "dtype": str(model.dtype).removeprefix("torch."),
            "prompt_len": opts.prompt_len,
            "context_len": context,
            "random_kv_prefix": prefix,
            "gen_len": opts.gen_len,
            "concurrency": opts.concurrency,
            "max_context": config.max_context,
            "prefill_chunk": config.prefill_chunk,
            "random_weights": config.random_weights,
            "cuda_graph": runner.graphs is not None,
            "eager_reason": runner.eager_reason,
            # the A/B switches this run was under (README: NINFER_PDL, NINFER_LOOKAHEAD, ...)
            "switches": switches(),
        },
        "kernels": {c.slot: c.name for c in p.choices},
        "copy_bandwidth_gbs": round(bandwidth / 1e9, 1),
        "build_s": None if reused else round(build_s, 2),
        "prefill": {
            "tokens": opts.prompt_len * opts.concurrency,
            "seconds": round(prefill_s, 4),
            "tok_s": round(opts.prompt_len * opts.concurrency / prefill_s, 1),
        },
        "decode": {
            "timed_steps": steps,
            "seconds": round(decode_s, 4),
            "tok_s": round(steps * opts.concurrency / decode_s, 2),
            "ms_per_step": round(ms_step, 3),
            "context_from": start_ctx,
            "context_to": end_ctx,
            # device time of the captured step alone (the rest of ms_per_step is the host's part)
            "graph_replay_ms": replay_ms,
        },
        "bytes_per_step": nbytes,
        # MoE: the routed experts in "weights" are those a step selects (see moe_read), not all
        "moe": routed,
        "roofline_ms": round(roofline_ms, 3),
        "roofline_share": round(roofline_ms / ms_step, 3),
        "memory": {
            "resident_after_build_gib": None if resident is None else round(resident, 2),
            "peak_serving_gib": _round(_peak_gib(device)),
            "peak_build_gib": _round(peak_build),
            "plan": p.memory.as_dict() if p.memory is not None else None,
        },
    }
    if config.spec != "none":
        result["spec"] = spec_run(p, config, model, cache, runner, requests, prefix, result["decode"])
    if opts.compare_transformers:
        prompt = torch.tensor(requests[0].prompt_ids[-opts.prompt_len :])
        del runner, cache, requests, batch
        if device.type == "cuda":
            torch.cuda.empty_cache()
        hf = compare_transformers(model, prompt, opts.compare_gen_len)
        hf["ratio"] = round(result["decode"]["tok_s"] / opts.concurrency / hf["decode_tok_s"], 2)
        # the same weights and prompt: both greedy first tokens should agree (bf16 may flip a near tie)
        hf["first_token_match"] = (hf.pop("first_token") == first_token) if prefix == 0 else None
        result["transformers"] = hf
    return result


def _replay_ms(runner: Any, rows: int) -> float | None:
    """Median of CUDA-event-timed replays of the last captured step, after the timed loop (a
    replay re-runs that step on its inputs: the cache is scratch by then)."""
    graphs = getattr(runner, "graphs", None)
    return _graph_ms(graphs.graphs.get(graphs.bucket(rows)) if graphs is not None else None)


# --- speculative rounds (--spec) --------------------------------------------------------------------

# Per-position acceptance published for the peer's MTP drafts: long reasoning, structured output.
PEER_ACCEPTANCE = (0.73, 0.88)


def tokens_per_round(a: float, k: int) -> float:
    """Expected tokens a round yields when each draft is accepted with probability `a` given the
    ones before it: draft i survives with a^i, and the correction or bonus always comes,
    so E = sum_{i=0..K} a^i."""
    return sum(a**i for i in range(k + 1))


def spec_run(
    p: Any, config: Any, model: Any, cache: Any, runner: Any, plain: list[Any], prefix: int, decode: dict[str, Any]
) -> dict[str, Any]:
    """The plain run's prompts again, decoded by speculative rounds (all of them in each round),
    timed in the same process as the plain steps in `decode`: ms per round against ms per step,
    rounds/s, acceptance, and the tok/s a round's cost gives at the peer's published acceptance
    (a projection: random weights accept almost nothing, so measured tok/s says little)."""
    from ninfer.config import SamplingParams
    from ninfer.request import Request
    from ninfer.scheduler import PrefillChunk
    from ninfer.speculative import SpeculativeRound

    device = model.device
    choice = next(c for c in p.choices if c.slot == "speculator")
    drafter = choice.impl.build(model=model, cache=cache, config=config)
    spec = SpeculativeRound(model, cache, runner.sampler, drafter, graphs=runner.graphs)
    # the plain steps' last one launched nothing ahead (max_new_tokens); from here rounds move the state
    assert runner._ahead is None
    runner.lookahead = False
    k, rows = spec.k, len(plain)
    # budget for every round to keep all K + 1 tokens (rounds launched ahead need it left over)
    params = SamplingParams(temperature=0.0, max_new_tokens=(decode["timed_steps"] + WARMUP_STEPS + 1) * (k + 1),
                            ignore_eos=True)
    requests = []
    for i, old in enumerate(plain):
        r = Request(f"bench-spec-{i}", old.prompt_ids, params)
        r.slot, r.num_computed = old.slot, prefix
        cache.reset(r.slot)  # the K/V prefix stays; the prompt is prefilled again, the drafter aligned over it
        for start in range(prefix, len(r.prompt_ids), config.prefill_chunk):
            end = min(start + config.prefill_chunk, len(r.prompt_ids))
            token = runner.prefill(PrefillChunk(r, start, end))
            spec.prefilled(r, start, end, runner.last_hidden, token)
        r.output_ids.append(token)
        requests.append(r)

    def round_() -> int:
        new = spec.run(requests)
        for r, toks in zip(requests, new):
            r.output_ids += toks
        return sum(len(t) for t in new)

    def room() -> bool:
        return all(r.num_tokens + k <= cache.max_context for r in requests)

    # no round launched ahead during the warm-up may run into the timed window
    ahead, spec.ahead = getattr(spec, "ahead", False), False
    for _ in range(WARMUP_STEPS):  # the first round captures its graph
        if room():
            round_()
    spec.ahead = ahead
    for r in requests:
        r.spec = type(r.spec)()
    # as many rounds as the plain run timed steps, while the context has room for one
    rounds = tokens = 0
    _sync(device)
    spec.host_s = dict.fromkeys(spec.host_s, 0.0)
    spec.ahead_rounds = 0
    t0 = time.perf_counter()
    while rounds < decode["timed_steps"] and room():
        tokens += round_()
        rounds += 1
    # every timed round has been read (a sync each); a round launched ahead of the last is not timed
    seconds = time.perf_counter() - t0
    _sync(device)
    if rounds == 0:
        raise UserError(f"no room for a speculative round of {k} drafts: raise --gen-len or --max-context.")
    ms_round = 1000 * seconds / rounds
    drafted = sum(r.spec.drafted for r in requests)
    accepted = sum(r.spec.accepted for r in requests)
    per_position = [sum(r.spec.accepted_per_position[i] for r in requests if len(r.spec.accepted_per_position) > i) for i in range(k)]
    rounds_s = rounds / seconds
    graph = runner.graphs.graphs.get(("spec", rows)) if runner.graphs is not None else None
    replay = _graph_ms(graph)
    verify = _verify_ms(spec, runner.graphs, rows) if graph is not None else None
    plain_replay = decode.get("graph_replay_ms")
    return {
        "method": config.spec,
        "draft_tokens": k,
        "cuda_graph": graph is not None,
        "eager_reason": None if graph is not None else (runner.eager_reason or spec.eager_reason),
        "timed_rounds": rounds,
        "seconds": round(seconds, 4),
        "ms_per_round": round(ms_round, 3),
        "plain_ms_per_step": decode["ms_per_step"],
        "round_vs_plain_step": round(ms_round / decode["ms_per_step"], 3),
        "rounds_per_s": round(rounds_s, 2),
        # device time of the captured round alone, and of its verify pass (target over K+1 rows per
        # sequence, with the logits): the rest is acceptance, GDN commit, MTP alignment and drafting
        "graph_replay_ms": replay,
        "verify_replay_ms": verify,
        "round_replay_vs_plain_replay": round(replay / plain_replay, 3) if replay and plain_replay else None,
        # where a round's wall time went on the host, ms per round: writing the inputs, launching
        # the graph (or the eager round), waiting for its results, bookkeeping after
        "host_ms_per_round": {k: round(1000 * v / rounds, 3) for k, v in spec.host_s.items()},
        # timed rounds that were launched ahead of the host reading the round before (on unless NINFER_SPEC_AHEAD=0)
        "ahead_rounds": getattr(spec, "ahead_rounds", 0),
        "measured_tok_s": round(tokens / seconds, 2),
        "stats": {
            "drafted": drafted,
            "accepted": accepted,
            "rounds": rounds * rows,
            "accepted_per_position": per_position,
            "acceptance": round(accepted / drafted, 4) if drafted else 0.0,
            "tokens_per_round": round(1 + accepted / (rounds * rows), 3),
        },
        "projection": {
            "formula": "tok/s = rounds/s x concurrency x sum_{i=0..K} a^i, a = per-position acceptance",
            **{
                f"a={a}": {
                    "tokens_per_round": round(tokens_per_round(a, k), 3),
                    "tok_s": round(rounds_s * rows * tokens_per_round(a, k), 2),
                }
                for a in PEER_ACCEPTANCE
            },
        },
    }


def _graph_ms(graph: Any) -> float | None:
    """Median device time of 10 replays of `graph` (None: no graph)."""
    if graph is None:
        return None
    times = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        new_epoch()  # what kernels noted as prepared may be overwritten (ninfer.kernels.epoch)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return round(statistics.median(times), 3)


def _verify_ms(spec: Any, graphs: Any, rows: int) -> float | None:
    """The verify pass of the last round's inputs captured on its own and replayed (it rewrites
    K/V and the GDN columns only: scratch once the timed rounds are done)."""
    try:
        with torch.inference_mode():
            graph = graphs.capture(("spec-verify", rows), lambda: spec._verify(rows, None))
    except Exception as exc:  # noqa: BLE001 - a breakdown only: the bench goes on without it
        log.warning("verify pass not captured for timing", error=str(exc))
        return None
    return _graph_ms(graph)


def spec_table(s: dict[str, Any]) -> list[str]:
    st, proj = s["stats"], s["projection"]
    how = "CUDA graph" if s["cuda_graph"] else f"eager: {s['eager_reason']}"
    lines = [
        f"  spec {s['method']} K={s['draft_tokens']}  {s['ms_per_round']:.3f} ms/round = {s['round_vs_plain_step']:.3f}x the plain "
        f"step ({s['plain_ms_per_step']:.3f} ms), {s['rounds_per_s']:.2f} rounds/s ({how})",
    ]
    if s.get("graph_replay_ms"):
        verify = f", verify {s['verify_replay_ms']:.3f} ms" if s.get("verify_replay_ms") else ""
        vs = f" ({s['round_replay_vs_plain_replay']}x the plain replay)" if s.get("round_replay_vs_plain_replay") else ""
        lines.append(f"  round replay       {s['graph_replay_ms']:.3f} ms{vs}{verify}")
    if s.get("host_ms_per_round"):
        lines.append("  host per round     " + ", ".join(f"{k} {v:.3f} ms" for k, v in s["host_ms_per_round"].items()))
    lines.append(
        f"  acceptance         {st['acceptance']:.3f} ({st['accepted']}/{st['drafted']}, per position {st['accepted_per_position']}), "
        f"{st['tokens_per_round']:.3f} tokens/round, measured {s['measured_tok_s']:.2f} tok/s"
    )
    for key, v in proj.items():
        if key != "formula":
            lines.append(f"  projection {key:<8} {v['tok_s']:,.2f} tok/s ({v['tokens_per_round']:.3f} tokens/round)")
    lines.append(f"  ({proj['formula']})")
    return lines


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _versions() -> dict[str, str]:
    out = {}
    for mod in ("triton", "fla", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent: not reported
            pass
    return out


# --- transformers on the same weights ----------------------------------------------------------------


def hf_text_config(shape: Any) -> dict[str, Any]:
    """transformers' Qwen3_5TextConfig fields for a qwen_hybrid shape."""
    fields = dict(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        layer_types=list(shape.layer_types),
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        linear_num_key_heads=shape.linear_num_key_heads,
        linear_num_value_heads=shape.linear_num_value_heads,
        linear_key_head_dim=shape.linear_key_head_dim,
        linear_value_head_dim=shape.linear_value_head_dim,
        linear_conv_kernel_dim=shape.linear_conv_kernel_dim,
        rms_norm_eps=shape.rms_norm_eps,
        tie_word_embeddings=shape.tie_word_embeddings,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": shape.rope_theta,
            "partial_rotary_factor": shape.rotary_dim / shape.head_dim,
        },
    )
    if shape.is_moe:
        fields.update(
            num_experts=shape.num_experts,
            num_experts_per_tok=shape.num_experts_per_tok,
            moe_intermediate_size=shape.moe_intermediate_size,
            shared_expert_intermediate_size=shape.shared_expert_intermediate_size,
        )
    else:
        fields["intermediate_size"] = shape.intermediate_size
    return fields


def build_transformers(model: Any) -> Any:
    """transformers' own CausalLM for `model`'s shape whose parameters ARE model's weight tensors
    (views, cast only where dtypes differ: the small fp32 norm and gate vectors), so both run the
    same numbers without a second copy of the weights."""
    import transformers
    from torch import nn

    from ninfer.linear import DENSE, QLinear

    shape = model.shape
    if shape.is_moe:
        raise UserError("--compare-transformers runs the dense models only; use qwen3.6-27b or qwen3.8-27b.")
    cfg = transformers.Qwen3_5TextConfig(**hf_text_config(shape))
    with torch.device("meta"):
        hf = transformers.Qwen3_5ForCausalLM(cfg)
    targets = model._weight_targets()
    for name, param in list(hf.named_parameters()):
        target = targets[name.removeprefix("model.")]
        if isinstance(target, QLinear):
            if target.scheme != DENSE:
                raise UserError("--compare-transformers needs the weights in bf16: use --quant bf16.")
            src = target.prepared
        else:
            module, attr = target
            src = getattr(module, attr)
        owner, _, leaf = name.rpartition(".")
        value = src.reshape(param.shape).to(model.dtype)
        hf.get_submodule(owner)._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    for owner_name, module in list(hf.named_modules()):
        if any(b.is_meta for b in module.buffers(recurse=False)):
            parent, _, leaf = owner_name.rpartition(".")
            # rotary tables: rebuilt from the config (on the CPU, then moved)
            setattr(hf.get_submodule(parent), leaf, type(module)(config=cfg).to(model.device))
    return hf.eval()


@torch.no_grad()
def compare_transformers(model: Any, prompt: torch.Tensor, gen: int) -> dict[str, Any]:
    hf = build_transformers(model)
    device = model.device
    ids = prompt.to(device)[None]
    _sync(device)
    t0 = time.perf_counter()
    out = hf(ids, use_cache=True, logits_to_keep=1)
    _sync(device)
    prefill_s = time.perf_counter() - t0
    past = out.past_key_values
    token = out.logits[:, -1:].argmax(-1)
    first = int(token[0, 0])
    for _ in range(WARMUP_STEPS):
        out = hf(token, past_key_values=past, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(gen):
        out = hf(token, past_key_values=past, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    _sync(device)
    decode_s = time.perf_counter() - t0
    del hf, past, out
    return {
        "class": "transformers.Qwen3_5ForCausalLM",
        "prompt_len": int(prompt.numel()),
        "prefill_tok_s": round(prompt.numel() / prefill_s, 1),
        "decode_steps": gen,
        "decode_tok_s": round(gen / decode_s, 3),
        "ms_per_step": round(1000 * decode_s / gen, 2),
        "first_token": first,
    }


# --- the report ------------------------------------------------------------------------------------


# NINFER_* variables that say where files live, not what runs
_PLACES = ("NINFER_CACHE", "NINFER_MODELS", "NINFER_REFERENCE_DIR")


def switches() -> dict[str, str]:
    """The NINFER_* environment variables set for this run that change what runs (kernel
    switches, plugin allow/block lists), by name."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("NINFER_") and k not in _PLACES}


def table(result: dict[str, Any]) -> str:
    c, d, pf = result["config"], result["decode"], result["prefill"]
    env = " ".join(f"{k}={v}" for k, v in c.get("switches", {}).items())
    lines = [
        f"{c['model']} {c['quant']} kv={c['kv_dtype']} on {result['device']}" + (f" ({env})" if env else ""),
        f"  copy bandwidth     {result['copy_bandwidth_gbs']:,.1f} GB/s (read + written)",
        f"  prefill            {pf['tok_s']:,.1f} tok/s ({pf['tokens']} tokens in {pf['seconds']:.3f} s, "
        f"chunks of {c['prefill_chunk']} tokens)",
        f"  decode             {d['tok_s']:,.2f} tok/s, {d['ms_per_step']:.3f} ms/step at context "
        f"{d['context_from']}..{d['context_to']} x {c['concurrency']} ({'CUDA graph' if c['cuda_graph'] else 'eager: ' + str(c['eager_reason'])}"
        + (f", replay {d['graph_replay_ms']:.3f} ms)" if d.get("graph_replay_ms") else ")"),
        f"  bytes per step     {result['bytes_per_step']['total'] / 1e9:.3f} GB (weights {result['bytes_per_step']['weights'] / 1e9:.3f}, "
        f"KV {result['bytes_per_step']['kv'] / 1e9:.3f}, state {result['bytes_per_step']['state'] / 1e9:.3f})",
        f"  roofline           {result['roofline_ms']:.3f} ms/step -> share {100 * result['roofline_share']:.1f}%",
    ]
    moe = result.get("moe")
    if moe:
        lines.append(
            f"  routed experts     {moe['experts_read_per_layer']:g} of {moe['experts']} read per layer: "
            f"{moe['routed_bytes_read'] / 1e9:.3f} GB of {moe['routed_bytes_all'] / 1e9:.3f} GB in the weights above"
        )
    lines += [
        f"  peak memory        {result['memory']['peak_serving_gib']} GiB serving, {result['memory']['peak_build_gib']} GiB while building",
    ]
    if result.get("spec"):
        lines += spec_table(result["spec"])
    hf = result.get("transformers")
    if hf:
        lines.append(f"  transformers       {hf['decode_tok_s']:.2f} tok/s decode ({hf['ms_per_step']} ms/step): ours {hf['ratio']}x")
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
