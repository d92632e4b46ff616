"""QLinear keeps the weight as loaded only where that costs no accelerator memory."""

from __future__ import annotations

import torch

from ninfer.linear import PackedWeight, QLinear


class _Kernel:
    name = "test.kernel"

    def __init__(self, repacks: bool) -> None:
        self.repacks = repacks

    def prepare(self, weight: PackedWeight):
        return {"own layout": weight.tensors["weight"].clone()}

    def apply(self, x, prepared):
        return x


def _load(device: str, repacks: bool) -> QLinear:
    q = QLinear("x", 4, 8, "s", _Kernel(repacks))
    q.set_weight(PackedWeight("s", (4, 8), {"weight": torch.zeros(4, 8, device=device)}))
    return q


def test_repacking_kernel_drops_the_original_off_the_cpu():
    # the meta device stands in for a GPU: any non-CPU tensor counts
    assert _load("meta", repacks=True).packed is None
    assert _load("meta", repacks=False).packed is not None
    assert _load("cpu", repacks=True).packed is not None
    assert _load("cpu", repacks=True).prepared is not None


def test_merge_dense_shares_the_weights_and_goes_stale_on_a_new_weight():
    from ninfer.linear import DENSE, DenseKernel, dense_weight, live, merge_dense

    g = torch.Generator().manual_seed(0)
    parts = []
    for i, n in enumerate((5, 3, 2)):
        q = QLinear(f"p{i}", n, 8, DENSE, DenseKernel())
        q.set_weight(dense_weight(torch.randn(n, 8, generator=g)))
        parts.append(q)
    x = torch.randn(4, 8, generator=g)
    want = [p(x) for p in parts]
    merged = merge_dense(parts, "merged")
    assert merged is not None and merged.splits == [5, 3, 2]
    for got, w in zip(merged(x).split(merged.splits, dim=-1), want):
        torch.testing.assert_close(got, w)
    # the parts are row views of the merged weight: held once
    assert parts[1].prepared.data_ptr() == merged.prepared[5:].data_ptr()
    assert live(merged) is merged
    parts[2].set_weight(dense_weight(torch.zeros(2, 8)))
    assert live(merged) is None
    # a quantized or unloaded part: nothing merged
    assert merge_dense([parts[0], QLinear("q", 4, 8, "q4_g64", DenseKernel())], "m") is None


def test_merge_dense_leaves_kernels_with_their_own_layout_alone():
    from ninfer.linear import DENSE, dense_weight, merge_dense

    class Transposing:
        name = "t"

        def prepare(self, w):
            return w.tensors["weight"].t().contiguous()

        def apply(self, x, w):
            return x @ w

    parts = []
    for i in range(2):
        q = QLinear(f"p{i}", 4, 8, DENSE, Transposing())
        q.set_weight(dense_weight(torch.randn(4, 8)))
        parts.append(q)
    assert merge_dense(parts, "m") is None


def test_merge_rows_drops_the_parts_loaded_copies_off_the_cpu():
    """A quantized merge re-points the parts at row views of the merged weight; where the loaded
    tensors are off the CPU they would otherwise stay alive beside the merged copy."""
    import torch

    from ninfer.linear import PackedWeight, QLinear, live, merge_rows

    class Stacking:
        name = "stack"

        def prepare(self, weight):
            return weight.tensors["q"]

        def merge_prepared(self, preps):
            merged = torch.cat(preps)
            return merged, [merged[:4], merged[4:]]

    parts = [QLinear(f"p{i}", 4, 8, "q4_g64", Stacking()) for i in range(2)]
    for i, p in enumerate(parts):
        p.set_weight(PackedWeight("q4_g64", (4, 8), {"q": torch.full((4, 8), float(i))}))
    merged = merge_rows(parts, "m")
    assert live(merged) is merged and merged.splits == [4, 4] and merged.n == 8
    assert parts[1].prepared.data_ptr() == merged.prepared[4:].data_ptr()
    assert all(p.packed is not None for p in parts)  # on the CPU kept (introspection)
    meta = [QLinear(f"m{i}", 4, 8, "q4_g64", Stacking()) for i in range(2)]
    for p in meta:
        p.set_weight(PackedWeight("q4_g64", (4, 8), {"q": torch.empty((4, 8), device="meta")}))
    assert merge_rows(meta, "mm") is not None
    assert all(p.packed is None for p in meta)
