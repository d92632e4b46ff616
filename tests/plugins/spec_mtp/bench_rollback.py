"""Rollback of the Gated DeltaNet state after a verify: per-column states vs snapshot + replay.

    python tests/plugins/spec_mtp/bench_rollback.py [--hidden 1024] [--layers 8] [--k 3]

Builds a random-weight hybrid model (the 27B's head and ratio geometry, fewer and narrower layers)
and times, per round of K drafts with A accepted:

* columns: verify keeping the state after each token (cache.keep_columns) + one state copy;
* replay:  snapshot, verify (chunked GDN), then restore + forward over the A+1 kept tokens (A < K);

against a plain decode step. Prints one JSON object (the numbers in BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def build(hidden: int, layers: int, vocab: int):
    from ninfer.config import EngineConfig
    from ninfer.device import probe
    from ninfer.plugins import get_plugin_manager
    from ninfer_plugins.qwen_hybrid.shape import parse_hf_config

    heads = hidden // 256 * 2 or 2
    cfg = {
        "model_type": "qwen3_5_text", "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads * 3, "num_key_value_heads": max(1, heads // 2), "head_dim": 256,
        "linear_num_key_heads": heads, "linear_num_value_heads": heads * 3, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "intermediate_size": hidden * 3,
        "rms_norm_eps": 1e-6, "full_attention_interval": 4, "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    }  # fmt: skip
    shape = parse_hf_config(cfg)
    pm = get_plugin_manager()
    config = EngineConfig(model="bench", random_weights=True, device="cpu")
    return pm.hook.ninfer_model(shape=shape, config=config, device=probe("cpu"), weights=None)


def timed(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    # the minimum: on a shared machine every other statistic measures the neighbours
    return min(times) * 1e3


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = build(a.hidden, a.layers, a.vocab)
    k, e = a.k, a.context
    cache = model.allocate_cache(1, e + 2 * k + 8, "bf16")
    model.forward(torch.randint(0, a.vocab, (e,)), cache, 0, 0)
    base = cache.snapshot(0)
    ids = torch.randint(0, a.vocab, (k + 1,))

    def decode():
        model.decode(ids[:1], cache, torch.tensor([0]), torch.tensor([e]), max_len=e + 1)
        cache.restore(0, base)

    def columns(accepted: int):
        def run():
            cache.keep_columns(0, k + 1)
            model.forward(ids, cache, 0, e)
            cache.stop_keeping(0)
            if accepted < k:
                cache.use_column(0, accepted)
            cache.restore(0, base)

        return run

    def replay(accepted: int):
        def run():
            snap = cache.snapshot(0)
            model.forward(ids, cache, 0, e)
            if accepted < k:
                cache.restore(0, snap)
                model.forward(ids[: accepted + 1], cache, 0, e)
            cache.restore(0, base)

        return run

    restore_only = timed(lambda: cache.restore(0, base), a.reps)
    step = timed(decode, a.reps) - restore_only
    out = {
        "shape": {"hidden": a.hidden, "layers": a.layers, "vocab": a.vocab, "k": k, "context": e},
        "state_mib_per_sequence": sum(t[0].numel() * t.element_size() for t in cache.conv + cache.recurrent) / 2**20,
        "threads": torch.get_num_threads(),
        "decode_step_ms": round(step, 2),
    }
    for name, make in (("columns", columns), ("replay", replay)):
        per = {acc: round(timed(make(acc), a.reps) - restore_only, 2) for acc in range(k + 1)}
        out[name + "_ms_by_accepted"] = per
        out[name + "_x_decode_by_accepted"] = {acc: round(v / step, 2) for acc, v in per.items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
