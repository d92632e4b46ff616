"""The plugin manager: finds plugins, picks one implementation per slot, says why.

Plugins come from the entry-point group `ninfer` (built-ins included), plus any registered in
code. Environment:

* `NINFER_PLUGINS=a,b`          load only these entry points (the allow list);
* `NINFER_DISABLE_PLUGINS=a,b`  never load these (the block list);
* `NINFER_TRACE_HOOKS=1`        log every hook call and its result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import pluggy
import structlog

from ninfer import hookspecs
from ninfer.device import DeviceInfo
from ninfer.errors import DeviceError

log = structlog.get_logger("ninfer.plugins")
GROUP = "ninfer"


def _env_list(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


@dataclass
class Choice:
    """One slot's decision: the chosen implementation and every candidate that was passed over."""

    slot: str
    impl: Any
    plugin: str
    # (plugin, implementation name or "-", why it was not chosen)
    passed_over: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return getattr(self.impl, "name", type(self.impl).__name__)


class PluginManager:
    def __init__(self, *, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.skipped: dict[str, str] = {}
        if load_entry_points:
            self._load_entry_points()
        if os.environ.get("NINFER_TRACE_HOOKS"):
            self.pm.trace.root.setwriter(lambda msg: log.debug("hook", trace=msg.rstrip()))
            self.pm.enable_tracing()

    # --- registration ----------------------------------------------------------------------------

    def _load_entry_points(self) -> None:
        allow = _env_list("NINFER_PLUGINS")
        block = _env_list("NINFER_DISABLE_PLUGINS") or set()
        for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
            if allow is not None and ep.name not in allow:
                self.skipped[ep.name] = "not in NINFER_PLUGINS"
                continue
            if ep.name in block:
                self.skipped[ep.name] = "in NINFER_DISABLE_PLUGINS"
                continue
            if self.pm.get_plugin(ep.name) is not None:
                continue
            self.pm.register(ep.load(), name=ep.name)
        if allow:
            unknown = allow - {ep.name for ep in entry_points(group=GROUP)}
            for name in sorted(unknown):
                log.warning("NINFER_PLUGINS names a plugin that is not installed", plugin=name)
        self.check()

    def register(self, plugin: Any, name: str | None = None) -> None:
        """Register a plugin object or module in code (tests, embedding applications)."""
        block = _env_list("NINFER_DISABLE_PLUGINS") or set()
        if name in block:
            self.skipped[name] = "in NINFER_DISABLE_PLUGINS"
            return
        self.pm.register(plugin, name=name)
        self.check()

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)

    def check(self) -> None:
        """Fail at start on a hookimpl whose name matches no spec (a misspelled hook)."""
        self.pm.check_pending()

    def plugin_names(self) -> list[str]:
        return sorted(name for name, _ in self.pm.list_name_plugin())

    @property
    def hook(self) -> Any:
        return self.pm.hook

    # --- collecting and choosing -----------------------------------------------------------------

    def collect(self, hook: str, **kwargs: Any) -> list[Any]:
        """Flatten a collect hook's lists."""
        out: list[Any] = []
        for part in getattr(self.pm.hook, hook)(**kwargs):
            if part:
                out.extend(part)
        return out

    def candidates(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Every plugin's answer to a choose hook, in the order pluggy would ask them."""
        caller = getattr(self.pm.hook, hook)
        out = []
        # pluggy calls its impl list back to front: tryfirst last in the list, asked first.
        for impl in reversed(caller.get_hookimpls()):
            args = {name: kwargs[name] for name in impl.argnames}
            out.append((impl.plugin_name, impl.function(**args)))
        return out

    def choose(self, hook: str, device: DeviceInfo, *, slot: str | None = None, **kwargs: Any) -> Choice:
        """The first answer to `hook` whose requirements hold on `device`.

        Raises DeviceError when no plugin offers an implementation that can run here, naming each
        candidate and why it was refused.
        """
        slot = slot or hook.removeprefix("ninfer_")
        passed: list[tuple[str, str, str]] = []
        chosen: tuple[str, Any] | None = None
        call_kwargs = dict(kwargs, device=device)
        for plugin, impl in self.candidates(hook, **call_kwargs):
            if impl is None:
                continue
            name = getattr(impl, "name", type(impl).__name__)
            if chosen is not None:
                passed.append((plugin, name, f"lower priority than {chosen[0]}"))
                continue
            req = getattr(impl, "requirements", None)
            problem = req.problem(device) if req is not None else None
            if problem:
                passed.append((plugin, name, problem))
                continue
            chosen = (plugin, impl)
        if chosen is None:
            detail = "; ".join(f"{p}:{n} {why}" for p, n, why in passed) or "no plugin offers one"
            raise DeviceError(
                f"No {slot} implementation can run on {device.describe()} ({detail}); choose another "
                f"--quant, --kv-dtype or --device, or install a plugin that supports {device.sm}."
            )
        return Choice(slot, chosen[1], chosen[0], passed)


_default: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, built on first use from the installed entry points."""
    global _default
    if _default is None:
        _default = PluginManager()
    return _default


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (tests that change NINFER_PLUGINS)."""
    global _default
    _default = None
