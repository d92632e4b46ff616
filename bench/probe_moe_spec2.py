"""Probe (device): the batched captured/eager MTP rounds of the medium int4 35B-A3B under switches."""
import os, sys, tempfile
sys.path.insert(0, "tests/plugins/spec_mtp")
from pathlib import Path
from test_spec_gpu import PROMPTS, PARAMS, _run, _spec_engine
from ninfer.testing import make_medium
from ninfer_plugins.moe_triton import moe as M

path = make_medium("qwen3.6-35b-a3b", Path(tempfile.mkdtemp()) / "m35")

def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        for j, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return (i, j)
    return None

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
