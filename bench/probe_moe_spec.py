"""Probe (device): where captured and eager MTP rounds of the medium int4 35B-A3B checkpoint part.
Runs each engine kind twice (determinism), and plain decode graph vs eager."""
import sys, tempfile
sys.path.insert(0, "tests/plugins/spec_mtp")
from pathlib import Path
from test_spec_gpu import PROMPTS, PARAMS, _run, _spec_engine
from ninfer.config import EngineConfig
from ninfer.startup import build_engine
from ninfer.testing import make_medium

path = make_medium("qwen3.6-35b-a3b", Path(tempfile.mkdtemp()) / "m35")

def first_diff(a, b):
    """Per sequence, the first token index where a and b differ (None where they agree)."""
    return [next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None) for x, y in zip(a, b)]

outs = {}
for name, graph in (("g1", True), ("g2", True), ("e1", False), ("e2", False)):
    outs[name] = _run(_spec_engine(path, 3, graph, quant="int4"), PROMPTS, PARAMS)
for name, graph in (("pg", True), ("pe", False)):
    cfg = EngineConfig(model=str(path), device="cuda", max_context=256, max_batch=4, cuda_graph=graph, quant="int4")
    outs[name] = _run(build_engine(cfg), PROMPTS, PARAMS)
for a, b in (("g1", "g2"), ("e1", "e2"), ("g1", "e1"), ("pg", "pe"), ("pg", "g1"), ("pe", "e1")):
    print(a, b, "equal" if outs[a] == outs[b] else f"first diff per sequence {first_diff(outs[a], outs[b])}")
# one sequence at a time: the pair kernels' path (T = 4 verify) without batching
for graph in (True, False):
    o = []
    for p, sp in zip(PROMPTS, PARAMS):
        o += _run(_spec_engine(path, 3, graph, quant="int4"), [p], [sp])
    outs["s" + ("g" if graph else "e")] = o
print("single sg se", "equal" if outs["sg"] == outs["se"] else f"first diff {first_diff(outs['sg'], outs['se'])}")
print("single se vs plain pe", "equal" if outs["se"] == outs["pe"] else f"first diff {first_diff(outs['se'], outs['pe'])}")
