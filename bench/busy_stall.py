"""What a long prompt costs the streams already decoding: the busy prefill chunk (--prefill-chunk-busy).

One engine (build_engine, as `ninfer serve` builds it; random weights on the GPU), D requests
decoding, then one request with a P-token prompt. The scheduler alternates one prefill chunk of
the long prompt with one decode step of the others; while they decode, a chunk takes at most
the busy chunk. For each busy chunk given (set on the same engine between runs): the decoding
streams' longest gap between two tokens while the long prompt prefills, their median gap, and
the long request's time to its first token.

    python3 bench/busy_stall.py --model qwen3.6-27b --quant int4 --prompt-len 16384 --busy 1024,2048,4096,16384
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def one_run(engine, busy: int, prompt_len: int, decoders: int, vocab: int, seed: int) -> dict:
    import random

    from ninfer.config import SamplingParams

    rng = random.Random(seed)
    engine.scheduler.prefill_chunk_busy = min(busy, engine.scheduler.prefill_chunk)
    streams = []
    for _ in range(decoders):
        ids = [rng.randrange(vocab) for _ in range(32)]
        streams.append(engine.add_request(ids, SamplingParams(temperature=0.0, max_new_tokens=100_000, ignore_eos=True)))
    last: dict[str, float] = {}
    # every stream past its first tokens: decode steps only
    while len(last) < decoders or min(len(engine._requests[s].output_ids) for s in streams) < 4:
        for out in engine.step():
            last[out.request_id] = time.perf_counter()
    long_ids = [rng.randrange(vocab) for _ in range(prompt_len)]
    t0 = time.perf_counter()
    long_id = engine.add_request(long_ids, SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True))
    gaps: list[float] = []
    ttft = None
    chunks = 0
    long = engine._requests[long_id]
    # until each stream has given 3 tokens past the long prompt's first: a launched-ahead decode
    # step hands its tokens back a step late, so the last chunk's stall shows only then
    after = {s: 0 for s in streams}
    while ttft is None or min(after.values()) < 3:
        done, prefilling = long.num_computed, long.prefilling
        outs = engine.step()
        chunks += prefilling and long.num_computed != done
        now = time.perf_counter()
        for out in outs:
            if out.request_id == long_id:
                ttft = ttft or now - t0
            elif out.request_id in last:
                gaps.append(now - last[out.request_id])
                last[out.request_id] = now
                if ttft is not None:
                    after[out.request_id] += 1
    for s in [*streams, long_id]:
        engine.abort(s)
    return {
        "busy_chunk": engine.scheduler.prefill_chunk_busy,
        "prefill_chunks": chunks,
        "ttft_s": round(ttft, 3),
        "max_gap_ms": round(max(gaps) * 1e3, 1) if gaps else None,
        "median_gap_ms": round(statistics.median(gaps) * 1e3, 2) if gaps else None,
        "prefill_tok_s": round(prompt_len / ttft),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen3.6-27b")
    ap.add_argument("--quant", default="int4")
    ap.add_argument("--prompt-len", type=int, default=16384)
    ap.add_argument("--decoders", type=int, default=4)
    ap.add_argument("--busy", default="1024,2048,4096,16384", help="busy chunks to run, in order")
    ap.add_argument("--prefill-chunk", type=int, default=0, help="0: the default the memory plan picks")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from ninfer.config import EngineConfig
    from ninfer.startup import build_engine

    model = args.model
    # a registered id builds random weights; a checkpoint directory (or the tiny one) loads its own
    random_weights = model != "tiny" and not Path(model).is_dir()
    if model == "tiny":
        from ninfer.testing import default_tiny_path

        model = str(default_tiny_path())
    config = EngineConfig(
        model=model,
        quant=args.quant,
        max_context=args.prompt_len + 512,
        prefill_chunk=args.prefill_chunk,
        device=args.device,
        max_batch=args.decoders + 1,
        random_weights=random_weights,
    )
    t = time.perf_counter()
    engine = build_engine(config)
    vocab = min(engine.model.shape.vocab_size, 32000)
    print(f"engine built in {time.perf_counter() - t:.0f} s; prefill chunk {engine.scheduler.prefill_chunk}", flush=True)
    # warm-up, each busy chunk: compiles, graph captures, the chunk shapes (and the 35B-A3B's grouped
    # MoE prefill, taken from 5,120 tokens a call)
    for busy in (int(b) for b in args.busy.split(",")):
        one_run(engine, busy, min(args.prompt_len, 2 * busy + 256), args.decoders, vocab, seed=0)
    rows = []
    for i, busy in enumerate(int(b) for b in args.busy.split(",")):
        row = one_run(engine, busy, args.prompt_len, args.decoders, vocab, seed=i + 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "quant": args.quant, "prompt_len": args.prompt_len,
                       "decoders": args.decoders, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
