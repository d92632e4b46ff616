"""Probe (device): a captured and an eager engine in lockstep on the same requests, comparing after
every engine step what each slot holds (GDN conv / recurrent state, the target's and the MTP
layer's K/V up to the slot's frontier, the slot's next drafts) and each request's tokens. Prints
the first step where anything differs, and what. Rounds launched ahead are off (NINFER_SPEC_AHEAD=0:
otherwise the captured engine's state runs a round ahead of what its outputs show); with --ahead they
are on, and the state is compared only after steps that leave no round in flight.

    python3 bench/probe_lockstep.py [--like qwen3.6-35b-a3b] [--quant int4] [--steps 200] [--ahead]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "tests/plugins/spec_mtp")

import torch  # noqa: E402
from test_spec_gpu import PARAMS, PROMPTS, _spec_engine  # noqa: E402

from ninfer.testing import make_medium  # noqa: E402


def held(engine, r) -> dict[str, torch.Tensor]:
    """What request r's slot holds that the next step reads, by name."""
    spec, slot, n = engine.speculative, r.slot, r.num_computed
    cache = spec.cache
    out = {}
    for i, (c, s) in enumerate(zip(cache.conv, cache.recurrent)):
        out[f"gdn{i}.conv"] = c[slot]
        out[f"gdn{i}.rec"] = s[slot]
    for i, (k, v) in enumerate(zip(cache.k, cache.v)):
        out[f"attn{i}.k"] = k[slot, :n]
        out[f"attn{i}.v"] = v[slot, :n]
    mtp = getattr(spec.drafter, "cache", None)
    if mtp is not None:
        out["mtp.k"] = mtp.k[slot, : max(0, n - 1)]
        out["mtp.v"] = mtp.v[slot, : max(0, n - 1)]
    out["drafts"] = spec.drafts[slot]
    out["counts"] = spec.history.counts[slot]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", default="qwen3.6-35b-a3b")
    ap.add_argument("--quant", default="int4")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ahead", action="store_true")
    args = ap.parse_args()
    os.environ["NINFER_SPEC_AHEAD"] = "1" if args.ahead else "0"
    path = make_medium(args.like, Path(tempfile.mkdtemp()) / "m")
    engines = {g: _spec_engine(path, 3, g, quant=args.quant) for g in (True, False)}
    reqs = {g: [e.add_request(p, sp) for p, sp in zip(PROMPTS, PARAMS)] for g, e in engines.items()}
    tokens = {g: {rid: [] for rid in reqs[g]} for g in engines}
    for step in range(args.steps):
        if not engines[True].has_unfinished():
            break
        for g, e in engines.items():
            for out in e.step():
                tokens[g][out.request_id] += out.new_token_ids
        torch.cuda.synchronize()
        tg, te = list(tokens[True].values()), list(tokens[False].values())
        if tg != te:
            print(f"step {step}: tokens differ: {[len(t) for t in tg]} / {[len(t) for t in te]}")
            return 1
        if engines[True].speculative._pending is not None:
            continue
        live = {g: [r for r in e._requests.values() if not r.finished and r.slot is not None] for g, e in engines.items()}
        for rg, re_ in zip(live[True], live[False]):
            if (rg.slot, rg.num_computed) != (re_.slot, re_.num_computed):
                print(f"step {step}: request {rg.id}: slot / frontier {rg.slot, rg.num_computed} against {re_.slot, re_.num_computed}")
                return 1
            a, b = held(engines[True], rg), held(engines[False], re_)
            bad = [(name, float((a[name].float() - b[name].float()).abs().max())) for name in a
                   if a[name].shape == b[name].shape and not torch.equal(a[name], b[name])]
            if bad:
                print(f"step {step}: request {rg.id} (slot {rg.slot}, frontier {rg.num_computed}, "
                      f"{len(tokens[True][rg.id])} tokens, batch {len(live[True])}): differs in {bad[:8]}")
                return 1
    print("no difference in", step + 1, "steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
