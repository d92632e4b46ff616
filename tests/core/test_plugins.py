"""The plugin door: a third-party package found through its entry point replaces a default."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from ninfer.device import DeviceInfo, Requirements, probe
from ninfer.errors import DeviceError
from ninfer.linear import LinearFactory, dense_weight
from ninfer.plugins import PluginManager

THIRD_PARTY = textwrap.dedent(
    '''
    """A throwaway third-party plugin: a bf16 linear kernel that counts its calls."""
    import torch
    from ninfer import hookimpl
    from ninfer.device import Requirements

    CALLS = []

    class CountingKernel:
        name = "counting-linear"
        requirements = Requirements(devices=("cpu",))

        def prepare(self, weight):
            return weight.tensors["weight"]

        def apply(self, x, w):
            CALLS.append(tuple(x.shape))
            return x @ w.T

    @hookimpl(tryfirst=True)
    def ninfer_linear_kernel(scheme, device, n, k):
        return CountingKernel() if scheme == "bf16" else None
    '''
)


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """Install a package with a `ninfer` entry point into a temporary sys.path entry."""
    pkg = tmp_path / "ninfer_counting"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(THIRD_PARTY)
    dist = tmp_path / "ninfer_counting-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ninfer-counting\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[ninfer]\ncounting = ninfer_counting\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ninfer_counting"
    sys.modules.pop("ninfer_counting", None)


def test_third_party_tryfirst_kernel_replaces_default(third_party):
    pm = PluginManager()
    assert "counting" in pm.plugin_names()
    cpu = probe("cpu")
    factory = LinearFactory(pm, cpu, recipe=None)
    layer = factory.make("layers.0.mlp.up_proj", 8, 4)
    assert layer.kernel.name == "counting-linear"
    w = torch.randn(8, 4)
    layer.set_weight(dense_weight(w))
    x = torch.randn(3, 4)
    torch.testing.assert_close(layer(x), x @ w.T)
    mod = sys.modules[third_party]
    assert mod.CALLS == [(3, 4)]
    # the default it displaced is reported as passed over, not silently lost
    choice = factory.choices[("bf16", 8, 4)]
    assert choice.plugin == "counting"
    assert any(p == "reference" for p, _, _ in choice.passed_over)


def test_disable_list_blocks_a_plugin(third_party, monkeypatch):
    monkeypatch.setenv("NINFER_DISABLE_PLUGINS", "counting")
    pm = PluginManager()
    assert "counting" not in pm.plugin_names()
    assert pm.skipped["counting"] == "in NINFER_DISABLE_PLUGINS"
    choice = pm.choose("ninfer_linear_kernel", probe("cpu"), scheme="bf16", n=2, k=2)
    assert choice.plugin == "reference"


def test_allow_list_loads_only_named(third_party, monkeypatch):
    monkeypatch.setenv("NINFER_PLUGINS", "reference")
    pm = PluginManager()
    assert pm.plugin_names() == ["reference"]
    assert pm.skipped["counting"] == "not in NINFER_PLUGINS"


def test_misspelled_hook_fails_at_start():
    from ninfer import hookimpl

    class Typo:
        @hookimpl
        def ninfer_linear_kernal(self, scheme, device, n, k):  # misspelled on purpose
            return None

    pm = PluginManager(load_entry_points=False)
    with pytest.raises(Exception, match="ninfer_linear_kernal"):
        pm.register(Typo(), name="typo")


def test_requirements_that_fail_fall_through_then_fail_clearly():
    from ninfer import hookimpl

    class NeedsBlackwell:
        name = "fp4-mma"
        requirements = Requirements(devices=("cuda",), min_capability=(10, 0), features=("fp4",))

    class Plugin:
        @hookimpl(tryfirst=True)
        def ninfer_linear_kernel(self, scheme, device, n, k):
            return NeedsBlackwell() if scheme == "nvfp4" else None

    pm = PluginManager(load_entry_points=False)
    pm.register(Plugin(), name="fp4")
    hopper = DeviceInfo("cuda", 0, "H200", (9, 0), 141 << 30, 140 << 30, 132, frozenset({"cuda", "bf16", "fp8"}))
    with pytest.raises(DeviceError, match=r"needs sm_100\+, this device is sm_90"):
        pm.choose("ninfer_linear_kernel", hopper, scheme="nvfp4", n=16, k=16)


def test_requirements_problem_messages():
    cpu = probe("cpu")
    assert Requirements().problem(cpu) is None
    assert "needs cuda" in Requirements(devices=("cuda",)).problem(cpu)
    big = Requirements(min_memory=cpu.total_memory * 4 + 1)
    assert "GiB" in big.problem(cpu)
