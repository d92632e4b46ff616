"""Kernel launches of one speculative round (--spec mtp, K drafts), counted on the CPU by phase.

    python bench/count_round_launches.py [--k 3] [--lm-head-draft] [--sampler triton|reference]

Builds the tiny 27B-like checkpoint of bench/count_launches.py (bf16, the cuda_fast backends with
their Triton kernels interpreted), an MTP drafter and an engine on it, prefills a prompt, then
counts what would be GPU launches during one batched round (`SpeculativeDecoder._round_step`, the
body a CUDA graph captures), split by phase: the verify pass (layers, then the head), accept and
sample (penalties, candidates, acceptance, correction), commit (GDN columns, history), the MTP
alignment over the K+1 columns, and the drafting (K heads, K-1 MTP steps). A Triton kernel or a
non-view aten op is one launch; on the H200 a launch inside a graph costs at least ~1-3 µs, so
the counts bound the round's fixed cost from below. Per-layer counts do not depend on the sizes;
the verify's layers are projected to the full model like count_launches does.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from count_launches import launches  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--lm-head-draft", action="store_true", help="draft through the shortlist head")
    ap.add_argument("--sequence", default=None, help="print this phase's launches in order")
    ap.add_argument("--sampler", choices=("triton", "reference"), default="triton",
                    help="the GPU's sampler (cuda_fast's fused kernels, interpreted) or the torch reference")
    args = ap.parse_args()
    import torch
    import triton.runtime.interpreter as interp
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    from ninfer.checkpoint import WeightSource, find_spec, load_hf_config
    from ninfer.config import SamplingParams
    from ninfer.device import probe
    from ninfer.engine import LLMEngine
    from ninfer.kernels.sampling import ReferenceSampler
    from ninfer.linear import LinearFactory
    from ninfer.plugins import get_plugin_manager
    from ninfer.speculative import SpeculativeRound
    from ninfer.testing import make_tiny
    from ninfer_plugins.cuda_fast.attention import FlashFullAttention
    from ninfer_plugins.cuda_fast.gdn import TritonLinearAttention
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel
    from ninfer_plugins.spec_mtp.mtp import MtpDrafter

    phase = ["setup"]
    counting, active = [False], [False]  # the round to count; inside its _round_step
    events: list[tuple[str, str]] = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            out = func(*args, **(kwargs or {}))
            if launches(name, args, out):
                events.append((phase[0], "aten." + name))
            return out

    run = interp.InterpretedFunction.run

    def counted(self, *a, **k):
        if counting[0] and active[0]:
            events.append((phase[0], "triton." + self.fn.__name__))
        with _disable_current_modes():
            return run(self, *a, **k)

    interp.InterpretedFunction.run = counted
    pm = get_plugin_manager()
    path = make_tiny("qwen3.6-27b", tempfile.mkdtemp(prefix="round_launches_"), vocab=512, layers=4)
    shape = pm.hook.ninfer_parse_config(hf_config=load_hf_config(path))
    schemes = {x.name: x for x in pm.collect("ninfer_quant_schemes")}
    model = QwenHybridModel(shape, LinearFactory(pm, probe("cpu"), None), torch.device("cpu"), torch.bfloat16,
                            FlashFullAttention(), TritonLinearAttention(), schemes)  # fmt: skip
    model.load_weights(WeightSource(path))
    cache = model.allocate_cache(1, 128, "bf16")
    head = None
    if args.lm_head_draft:
        from ninfer_plugins.spec_mtp.shortlist import ShortlistHead

        head = ShortlistHead(model, torch.arange(0, 512, 2), schemes)
    drafter = MtpDrafter(model, cache.num_slots, 128, args.k, head=head, target_cache=cache)

    from ninfer.frontend.tokenizer import load_tokenizer

    if args.sampler == "triton":
        from ninfer_plugins.cuda_fast.sampler import TritonSampler

        sampler = TritonSampler()
    else:
        sampler = ReferenceSampler()
    eng = LLMEngine(model, cache, sampler, load_tokenizer(None), max_context=128, prefill_chunk=64, max_batch=1,
                    speculator=drafter)
    spec: SpeculativeRound = eng.speculative

    def mark(obj, name, label):
        orig = getattr(obj, name)

        def wrapped(*a, **k):
            before, phase[0] = phase[0], label
            try:
                return orig(*a, **k)
            finally:
                phase[0] = before

        setattr(obj, name, wrapped)

    orig_step = spec._round_step

    def round_step(*a, **k):
        if not counting[0]:
            return orig_step(*a, **k)
        phase[0], active[0] = "accept + sample + commit", True
        try:
            with Count():
                return orig_step(*a, **k)
        finally:
            active[0] = False

    spec._round_step = round_step
    mark(spec.verifier, "forward", "verify: layers")
    mark(model, "compute_logits", "verify: head")
    mark(spec.verifier, "commit", "commit: GDN columns")
    mark(drafter, "align_rows", "draft: MTP alignment (K+1 columns)")
    mark(drafter, "align_seeds", "draft: MTP alignment (K+1 columns)")
    mark(drafter, "draft", "draft: K heads + K-1 MTP steps")
    p = SamplingParams(temperature=0.0, max_new_tokens=2 * (args.k + 1) + 2, ignore_eos=True)
    with torch.no_grad():
        eng.add_request(list(range(5, 30)), p, request_id="r")
        rounds = 0
        while eng.has_unfinished() and rounds < 3:
            counting[0] = rounds == 2  # the third step: a round with drafts ready
            eng.step()
            rounds += 1
    if not events:
        print("no round was counted (the engine took no speculative round)", file=sys.stderr)
        return 1
    kinds = ["attention" if t == "full_attention" else "gdn" for t in shape.layer_types]
    by_phase = collections.Counter(e[0] for e in events)
    print(f"one speculative round, K = {args.k}, tiny qwen3.6-27b (bf16; layers {kinds}); "
          f"head: {'shortlist' if head is not None else 'full'}")
    for ph, n in by_phase.items():
        ops = collections.Counter(e[1] for e in events if e[0] == ph)
        print(f"  {ph}: {n} launches: " + ", ".join(f"{v} {k}" for k, v in ops.most_common()))
    if args.sequence:
        print(f"  {args.sequence}, in order: " + " ".join(e[1].split(".", 1)[1] for e in events if e[0] == args.sequence))
    spec_full = find_spec("qwen3.6-27b", pm.collect("ninfer_checkpoints"))
    full = collections.Counter("attention" if t == "full_attention" else "gdn" for t in spec_full.shape.get("layer_types") or [])
    print(f"  total {len(events)} launches (verify layers here for {len(kinds)} layers; the full model has "
          f"{full['gdn']} GDN + {full['attention']} attention)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
