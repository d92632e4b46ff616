"""Quantization quality on tiny random checkpoints (CPU): next-token KL against the unquantized
model and greedy agreement.

    python bench/quant_quality.py [--json FILE]

For each registered family shape (dense like Qwen3.6-27B, MoE like Qwen3.6-35B-A3B) a tiny
checkpoint is built (`ninfer make-tiny`, vocab 1024, seed 0) and loaded four times: bf16 weights
(computed in fp32 on the CPU: the reference), `--quant int8`, `--quant int4`, `--quant nvfp4`.
Reported per format: mean and max over 48 teacher-forced positions of KL(p_ref || p_quant), the
share of positions whose argmax agrees, and over 64 greedy tokens from an 8-token prompt the
number of equal tokens and the first position that differs.

Random tiny models have nearly flat next-token distributions (small logit margins), so greedy
agreement there is much lower than on a trained model; KL is the comparable figure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch


def evaluate(like: str, prompt_len: int = 48, greedy: int = 64) -> dict[str, dict[str, float]]:
    from ninfer.testing import greedy_generate, load_model, make_tiny

    path = make_tiny(like, tempfile.mkdtemp() + "/m", seed=0, vocab=1024)
    prompt = torch.randint(0, 1024, (prompt_len,), generator=torch.Generator().manual_seed(1))
    models = {q: load_model(path, device="cpu", quant=q) for q in ("bf16", "int8", "int4", "nvfp4")}

    def logprobs(m) -> torch.Tensor:
        cache = m.allocate_cache(1, prompt_len + 1, "bf16")
        return torch.log_softmax(m.compute_logits(m.forward(prompt, cache, 0, 0)).float(), -1)

    ref = logprobs(models["bf16"])
    g_ref = greedy_generate(models["bf16"], prompt[:8], greedy)
    out = {}
    for q in ("int8", "int4", "nvfp4"):
        lq = logprobs(models[q])
        kl = (ref.exp() * (ref - lq)).sum(-1)
        g = greedy_generate(models[q], prompt[:8], greedy)
        out[q] = {
            "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()),
            "top1_agree": float((lq.argmax(-1) == ref.argmax(-1)).float().mean()),
            "greedy_equal": sum(a == b for a, b in zip(g, g_ref)),
            "greedy_first_diff": next((i for i, (a, b) in enumerate(zip(g, g_ref)) if a != b), greedy),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.time()
    results = {like: evaluate(like) for like in ("qwen3.6-27b", "qwen3.6-35b-a3b")}
    print("| model | format | KL mean | KL max | top-1 agree | greedy equal / 64 | first diff |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for like, per in results.items():
        for q, r in per.items():
            print(
                f"| tiny {like} | {q} | {r['kl_mean']:.4f} | {r['kl_max']:.4f} | {r['top1_agree']:.0%} | "
                f"{r['greedy_equal']} | {r['greedy_first_diff']} |"
            )
    print(f"({time.time() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
