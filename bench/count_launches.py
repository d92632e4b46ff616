"""Kernel launches of one decode step on the fast path, counted on the CPU (no GPU needed).

    python bench/count_launches.py [--like qwen3.6-27b]

Builds a tiny checkpoint of the family with one attention layer among GDN layers, runs one
decode step on the cuda_fast backends in bf16 with their Triton kernels interpreted
(TRITON_INTERPRET=1), and counts what would be a GPU launch: every Triton kernel call, every
aten op that is not a view or an allocation. Per layer type the counts do not depend on the
layer sizes, so the step of the full model is projected as (GDN layers x GDN count + attention
layers x attention count + the rest); in a CUDA graph each launch costs about 1 µs of the step
(device README: 768 tiny kernels took 0.79 ms on the H200). bf16 only: on a GPU a quantized
linear is one launch as well (its Triton kernel instead of the GEMM), so the count holds for
every recipe; the CPU's reference path for quantized linears would add dtype conversions.
Per kind the count of the last layer of that kind is used (the first GDN layer also does the
step's one zeroing of the GDN kernel's counters). A MoE model runs the reference MoE here (torch
ops: its count is not the Triton MoE's five launches a layer), so the figure is for dense models.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "1"

# views, metadata and allocations: no kernel on a GPU
NO_LAUNCH = {
    "view", "_unsafe_view", "as_strided", "t", "transpose", "unsqueeze", "squeeze", "select", "slice", "expand",
    "detach", "alias", "permute", "split", "split_with_sizes", "unbind", "chunk", "narrow", "lift_fresh", "empty",
    "empty_like", "empty_strided", "reshape", "_reshape_alias", "diagonal", "unfold", "sym_size", "sym_stride",
    "is_same_size", "resolve_conj", "resolve_neg", "view_as_real", "view_as_complex",
}  # fmt: skip


def launches(name: str, args: tuple, out: object) -> bool:
    """Whether an aten op is a kernel launch: not a view-like op, and not a `to` that returned its
    input (under inference mode the dispatcher shows `aten.to` even when nothing is copied)."""
    if name in NO_LAUNCH:
        return False
    return not (name == "to" and args and out is args[0])


# id(module) -> index of the decoder layer it belongs to (filled once the model is built)
OWNER: dict[int, str] = {}


def _layer_of_caller() -> str:
    """The decoder layer whose code is on the stack (its module or a submodule as `self`)."""
    frame = inspect.currentframe()
    while frame is not None:
        for name in ("self", "layer"):  # a layer's own code, or the model's loop over its layers
            owner = OWNER.get(id(frame.f_locals.get(name)))
            if owner is not None:
                return owner
        frame = frame.f_back
    return "other"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", default="qwen3.6-27b")
    args = ap.parse_args()
    import torch
    import triton.runtime.interpreter as interp
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    from ninfer.checkpoint import WeightSource, find_spec, load_hf_config
    from ninfer.device import probe
    from ninfer.linear import LinearFactory
    from ninfer.plugins import get_plugin_manager
    from ninfer.testing import make_tiny
    from ninfer_plugins.cuda_fast.attention import FlashFullAttention
    from ninfer_plugins.cuda_fast.gdn import TritonLinearAttention
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    events: list[tuple[str, str, str]] = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            out = func(*args, **(kwargs or {}))
            if launches(name, args, out):
                events.append(("aten." + name, "", _layer_of_caller()))
            return out

    run = interp.InterpretedFunction.run

    def counted(self, *a, **k):
        events.append(("triton." + self.fn.__name__, "", _layer_of_caller()))
        with _disable_current_modes():
            return run(self, *a, **k)

    interp.InterpretedFunction.run = counted
    pm = get_plugin_manager()
    path = make_tiny(args.like, tempfile.mkdtemp(prefix="launches_"), vocab=512, layers=4)
    shape = pm.hook.ninfer_parse_config(hf_config=load_hf_config(path))
    recipe = None
    schemes = {x.name: x for x in pm.collect("ninfer_quant_schemes")}
    model = QwenHybridModel(shape, LinearFactory(pm, probe("cpu"), recipe), torch.device("cpu"), torch.bfloat16,
                            FlashFullAttention(), TritonLinearAttention(), schemes)  # fmt: skip
    model.load_weights(WeightSource(path))
    kinds = ["attention" if t == "full_attention" else "gdn" for t in shape.layer_types]
    OWNER.update({id(m): str(i) for i, block in enumerate(model.layers) for m in block.modules()})
    cache = model.allocate_cache(1, 64, "bf16")
    with torch.no_grad():
        model.forward(torch.arange(1, 6), cache, 0, 0)
        events.clear()
        with Count():
            hidden = model.decode(torch.tensor([7]), cache, torch.tensor([0]), torch.tensor([5]))
            model.compute_logits(hidden)
    per_layer = collections.Counter(e[2] for e in events)
    by_kind: dict[str, int] = {}
    for i, kind in enumerate(kinds):
        by_kind[kind] = per_layer.get(str(i), 0)  # the last of its kind: the first GDN layer also zeroes the step's counters
    other = per_layer.get("other", 0)
    print(f"tiny {args.like} (bf16): layer kinds {kinds}")
    for kind, n in by_kind.items():
        last = max(i for i, k in enumerate(kinds) if k == kind)
        ops = collections.Counter(e[0] for e in events if e[2] == str(last))
        print(f"  {kind}: {n} launches a layer: " + ", ".join(f"{v} {k}" for k, v in ops.most_common()))
    print(f"  outside the layers (embedding, final norm, head, step metadata): {other}")
    spec = find_spec(args.like, pm.collect("ninfer_checkpoints"))
    full = spec.shape.get("layer_types") or []
    counts = collections.Counter("attention" if t == "full_attention" else "gdn" for t in full)
    if counts:
        total = sum(by_kind.get(k, 0) * v for k, v in counts.items()) + other
        print(f"projected for {args.like} ({counts['gdn']} GDN + {counts['attention']} attention layers): {total} launches a decode step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
