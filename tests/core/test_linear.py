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
