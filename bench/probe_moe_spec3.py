"""Probe (device): which round of the medium int4 35B-A3B's batched captured MTP rounds first
differs from eager (rounds launched ahead on), with the launches that made it; and whether a
device sync after every launch (a host/device race) or non-power-of-two batches matter."""
import sys, tempfile
sys.path.insert(0, "tests/plugins/spec_mtp")
from pathlib import Path
import torch
from test_spec_gpu import PROMPTS, PARAMS, _run, _spec_engine
from ninfer.testing import make_medium
from ninfer import speculative as S

path = make_medium("qwen3.6-35b-a3b", Path(tempfile.mkdtemp()) / "m35")
cls = next(c for c in vars(S).values() if isinstance(c, type) and hasattr(c, "_book_row") and hasattr(c, "_launch"))
o_launch, o_row = cls._launch, cls._book_row
LOG, SYNC = [], [False]


def launch(self, reqs, ahead=False):
    out = o_launch(self, reqs, ahead)
    LOG.append(("launch", len(reqs), ahead, tuple(r.id for r in reqs)))
    if SYNC[0]:
        torch.cuda.synchronize()
    return out


def book_row(self, r, row):
    out = o_row(self, r, row)
    LOG.append(("row", r.id, len(r.output_ids), tuple(out)))
    return out


cls._launch, cls._book_row = launch, book_row


def run(graph, params=PARAMS, prompts=PROMPTS):
    LOG.clear()
    toks = _run(_spec_engine(path, 3, graph, quant="int4"), prompts, params)
    return toks, list(LOG)


def rows(log):
    ids = sorted({e[1] for e in log if e[0] == "row"})
    first = min(ids)
    return [e for e in log if e[0] == "row" and e[1] == first], first


def report(name, a, b):
    (ta, la), (tb, lb) = a, b
    if ta == tb:
        print(name, "equal", flush=True)
        return
    ra, first = rows(la)
    rb, _ = rows(lb)
    j = next(j for j, (x, y) in enumerate(zip(ra, rb)) if x != y)
    print(name, "differ: request", first, "round", j, "of", len(ra), flush=True)
    for lab, log, r in (("A", la, ra[j]), ("B", lb, rb[j])):
        i = log.index(r)
        print(" ", lab, "row", r[1:], flush=True)
        for e in log[max(0, i - 8): i + 1]:
            print("     ", e, flush=True)


eager = run(False)
report("graph ahead vs eager", run(True), eager)
SYNC[0] = True
report("graph ahead + sync after each launch vs eager", run(True), eager)
SYNC[0] = False
# four requests (every batch a power of two until they end) and two (never three)
from ninfer.config import SamplingParams  # noqa: E402
g4 = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in (40, 28, 33, 36)]
p4 = PROMPTS + PROMPTS[:1]
report("four greedy", run(True, g4, p4), run(False, g4, p4))
g3 = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in (40, 40, 40)]
report("three greedy, same lengths", run(True, g3), run(False, g3))
