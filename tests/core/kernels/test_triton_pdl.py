"""launch.late_dependents on the hardware: a kernel launched after a PDL = 2 launch may read,
before its own PDL wait, what the kernels before that launch wrote.

The chain: a writer (PDL; triggers at its start, then spins ~200 µs and writes X = k) -> a middle
launch (inside late_dependents: PDL = 2; or, as the control, PDL = True) -> a reader (reads X past
L1 BEFORE its wait, stores what it saw). With the middle launch late, every read must see k. With
it early, the reader can be resident while the writer still spins and read the old value: how
often that happens is printed, not asserted (if the control never sees a stale value, the chain
did not overlap on that card, and the check above proves little). Eager and replayed in a graph.
CPU: the PTX of each kernel launched with PDL = 2 waits before it triggers."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import launch as L
from ninfer.kernels.triton.launch import pdl_early_trigger, pdl_kwargs, pdl_prologue, pdl_wait

SPIN_NS = 200_000


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _slow_writer(X, k, SPIN_NS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    t0 = _now()
    t = t0
    while t - t0 < SPIN_NS:
        t = _now()
    tl.store(X, k + (t - t0 < 0).to(tl.int32))  # k (the comparison keeps the loop live)


@triton.jit
def _middle(Y, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    tl.store(Y + tl.program_id(0), 1)


@triton.jit
def _early_reader(X, OUT, i, PDL: tl.constexpr = False):
    pdl_early_trigger(PDL)
    v = tl.load(X, cache_modifier=".cg")
    pdl_wait(PDL)
    tl.store(OUT + i, v)


def _chain(x, y, out, i, k, late):
    dev = x.device
    _slow_writer[(1,)](x, k, SPIN_NS=SPIN_NS, num_warps=1, **pdl_kwargs(dev))
    with L.late_dependents() if late else contextlib.nullcontext():
        _middle[(4,)](y, num_warps=1, **pdl_kwargs(dev))
    _early_reader[(1,)](x, out, i, num_warps=1, **pdl_kwargs(dev))


def test_pdl_constexpr_of_a_launch():
    # off the GPU PDL is off; the value a launch gets with it on, in and out of the scope
    assert L.pdl_kwargs(torch.device("cpu")) == {}
    assert L.pdl_value() is True and L.pdl_value(late=True) == 2
    with L.late_dependents():
        assert L.pdl_value() == 2 and L.pdl_value(scoped=False) is True
        with L.late_dependents():
            assert L.pdl_value() == 2
        assert L.pdl_value() == 2
    assert L.pdl_value() is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9, reason="needs sm_90")
def test_late_launch_waits_before_it_triggers_in_ptx():
    y = torch.zeros(4, dtype=torch.int32, device="cuda")
    with L.late_dependents():
        k = _middle[(4,)](y, num_warps=1, **pdl_kwargs(y.device))
    ops = re.findall(r"griddepcontrol\.(\w+)", k.asm["ptx"])
    assert ops[:2] == ["wait", "launch_dependents"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9, reason="needs sm_90")
@pytest.mark.parametrize("graph", [False, True])
def test_late_dependents_orders_reads_before_the_wait(graph):
    n = 32
    x = torch.zeros(1, dtype=torch.int32, device="cuda")
    y = torch.zeros(4, dtype=torch.int32, device="cuda")
    seen = {}
    for late in (True, False):
        out = torch.full((n,), -1, dtype=torch.int32, device="cuda")
        want = []
        for i in range(n):
            k = 1000 * (i + 1) + int(late)
            want.append(k)
            x.zero_()  # a plain (non-PDL) launch: the chain starts from a completed state
            if graph:
                _chain(x, y, out, i, k, late)  # compiled eagerly first
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    _chain(x, y, out, i, k, late)
                x.zero_()
                g.replay()
            else:
                _chain(x, y, out, i, k, late)
        torch.cuda.synchronize()
        seen[late] = (out.tolist(), want)
    got, want = seen[True]
    assert got == want, "a read before the wait saw a value written two launches back, the middle launch late"
    got, want = seen[False]
    stale = sum(g != w for g, w in zip(got, want))
    print(f"control (the middle launch early): {stale} of {n} reads before the wait were stale")
