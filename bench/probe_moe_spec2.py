"""Probe (device): the batched captured/eager MTP rounds of the medium int4 35B-A3B under switches."""
import os, sys, tempfile
sys.path.insert(0, "tests/plugins/spec_mtp")
from pathlib import Path
from test_spec_gpu import PROMPTS, PARAMS, _run, _spec_engine
from ninfer.testing import make_medium
from ninfer_plugins.moe_triton import moe as M

path = make_medium("qwen3.6-35b-a3b", Path(tempfile.mkdtemp()) / "m35")

def first_diff(a, b):
    """Per sequence, the first token index where a and b differ (None where they agree)."""
    return [next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None) for x, y in zip(a, b)]

def case(name):
    o = {g: _run(_spec_engine(path, 3, g, quant="int4"), PROMPTS, PARAMS) for g in (True, False)}
    print(name, "equal" if o[True] == o[False] else f"first diff {first_diff(o[True], o[False])}", flush=True)

for env in ("NINFER_SPEC_AHEAD=0", "NINFER_PDL=0", "NINFER_KW=0", "NINFER_H2=0"):
    k, v = env.split("=")
    old = os.environ.get(k)
    os.environ[k] = v
    try:
        case(env)
    finally:
        os.environ.pop(k) if old is None else os.environ.__setitem__(k, old)
orig = M.TritonMoe.takes_pairs
M.TritonMoe.takes_pairs = lambda self, *a, **k: False
case("no pair kernels")
M.TritonMoe.takes_pairs = orig
# two greedy sequences only
P2, S2 = PROMPTS[:2], PARAMS[:2]
o = {g: _run(_spec_engine(path, 3, g, quant="int4"), P2, S2) for g in (True, False)}
print("two greedy", "equal" if o[True] == o[False] else f"first diff {first_diff(o[True], o[False])}")
# the three requests all greedy (no penalties), and the dense family at the same medium int4 widths
from ninfer.config import SamplingParams  # noqa: E402

greedy = [SamplingParams(temperature=0.0, max_new_tokens=p.max_new_tokens, ignore_eos=True) for p in PARAMS]
o = {g: _run(_spec_engine(path, 3, g, quant="int4"), PROMPTS, greedy) for g in (True, False)}
print("three greedy", "equal" if o[True] == o[False] else f"first diff {first_diff(o[True], o[False])}", flush=True)
dense = make_medium("qwen3.6-27b", Path(tempfile.mkdtemp()) / "m27")
o = {g: _run(_spec_engine(dense, 3, g, quant="int4"), PROMPTS, PARAMS) for g in (True, False)}
print("dense 27B medium int4", "equal" if o[True] == o[False] else f"first diff {first_diff(o[True], o[False])}")
