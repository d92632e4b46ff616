"""Acceptance of the trained tiny MTP on held-out text, correctly wired and deliberately mis-wired.

Two measurements (numbers in BENCHMARKS.md, "Speculative decoding"):

* teacher-forced: over held-out bytes x, the MTP column t (hidden h_t, token x_{t+1}) drafts
  x_{t+2}; it counts as accepted when it equals the target's greedy choice after x_{<=t+1}. This
  is the first-draft acceptance of a round anchored anywhere in the held-out text.
* end to end: the engine's greedy speculative rounds (K = 3) from held-out prompts, with the
  round's own alignment (the code under test) or a subclass that mis-wires it.

Mis-wirings (formats.md 7, spec 3.3): "wrong shift" gives column t the token x_t instead of
x_{t+1}; "wrong hidden" gives it the hidden of the column before (h_{t-1}).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ninfer.config import EngineConfig, SamplingParams
from ninfer.engine import LLMEngine
from ninfer.kernels.sampling import ReferenceSampler
from ninfer.speculative import SpeculativeRound


def _prev(hidden: torch.Tensor) -> torch.Tensor:
    return torch.cat((hidden[:1], hidden[:-1]))


WIRINGS = {
    "correct": lambda now, nxt, h: (nxt, h),
    "wrong shift": lambda now, nxt, h: (now, h),
    "wrong hidden": lambda now, nxt, h: (nxt, _prev(h)),
}


class Miswired(SpeculativeRound):
    wiring = "correct"

    def _mtp_inputs(self, now, nxt, hidden):
        return WIRINGS[self.wiring](now, nxt, hidden)


@torch.inference_mode()
def teacher_forced(model, drafter, texts: list[list[int]]) -> dict[str, float]:
    hits = {w: 0 for w in WIRINGS}
    total = 0
    for x in texts:
        ids = torch.tensor(x)
        cache = model.allocate_cache(1, len(x), "bf16")
        h = model.forward(ids, cache, 0, 0)
        greedy = model.compute_logits(h).argmax(-1)  # greedy[t] is the target's choice for x_{t+1}
        want = greedy[1:-1]  # column t drafts x_{t+2}: compare with greedy[t+1], t = 0..L-3
        for w, wire in WIRINGS.items():
            tokens, hidden = wire(ids[:-1], ids[1:], h[:-1])
            out = drafter.align(0, tokens, hidden, 0)
            hits[w] += int((drafter.propose(out[:-1]) == want).sum())
        total += len(want)
    return {w: hits[w] / total for w in WIRINGS}


def end_to_end(model, tok, prompts: list[list[int]], k: int, new: int, temperature: float = 0.0) -> dict[str, dict]:
    from ninfer_plugins.spec_mtp.plugin import MtpSpeculator

    out = {}
    for w in WIRINGS:
        cache = model.allocate_cache(4, 1024, "bf16")
        drafter = MtpSpeculator().build(model, cache, EngineConfig(model="x", spec="mtp", draft_tokens=k))
        eng = LLMEngine(model, cache, ReferenceSampler(), tok, max_context=1024, max_batch=4, speculator=drafter)
        eng.speculative = Miswired(model, cache, eng.runner.sampler, drafter)
        eng.speculative.wiring = w
        drafted = accepted = rounds = 0
        for i, p in enumerate(prompts):
            sp = SamplingParams(temperature=temperature, top_p=1.0, seed=i, max_new_tokens=new, ignore_eos=True)
            s = eng.generate(p, sp).stats["spec"]
            drafted, accepted, rounds = drafted + s["drafted"], accepted + s["accepted"], rounds + s["rounds"]
        out[w] = {"acceptance": accepted / drafted, "tokens_per_round": 1 + accepted / rounds}
    return out


def report(path: Path, *, texts: int = 8, text_len: int = 512, prompts: int = 12, k: int = 3, new: int = 64) -> dict:
    import json

    from mtp_hf import held_out_prompts

    from ninfer.frontend.tokenizer import load_tokenizer
    from ninfer.testing import load_model
    from ninfer_plugins.spec_mtp.mtp import MtpDrafter

    model = load_model(path, spec="mtp")
    drafter = MtpDrafter(model, 1, 1024, k)
    tok = load_tokenizer(None)
    return {
        "train": {key: v for key, v in json.loads((Path(path) / "train.json").read_text()).items() if key != "losses"},
        "teacher_forced_first_draft": teacher_forced(model, drafter, held_out_prompts(texts, text_len)),
        f"end_to_end_k{k}_greedy": end_to_end(model, tok, held_out_prompts(prompts, 96), k, new),
        f"end_to_end_k{k}_t0.8": end_to_end(model, tok, held_out_prompts(prompts, 96), k, new, temperature=0.8),
    }
