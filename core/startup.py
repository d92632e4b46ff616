"""Everything before the first step: device, checkpoint, validation, choices, then the engine.

`plan()` reads only config files: it probes the device, finds the checkpoint, recognises its
family and registered spec, asks every plugin for problems, and picks the sampler. An impossible
request fails here (UserError / DeviceError, exit code 2) before a byte of weights is read.
`build_engine()` then loads weights and allocates the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
from msgspec import structs

from ninfer.config import CheckpointSpec, EngineConfig
from ninfer.device import DeviceInfo, probe
from ninfer.errors import DeviceError, UserError
from ninfer.memory import BUSY_PREFILL_CHUNK, MemoryPlan, plan_memory
from ninfer.plugins import Choice, PluginManager, get_plugin_manager

log = structlog.get_logger("ninfer.startup")


@dataclass
class Plan:
    config: EngineConfig
    device: DeviceInfo
    path: Path | None  # checkpoint directory (None: random weights or not found and not needed)
    hf_config: dict[str, Any]
    shape: Any
    spec: CheckpointSpec | None
    choices: list[Choice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    memory: MemoryPlan | None = None

    @property
    def generic(self) -> bool:
        """An unregistered shape of a known family: runs on the generic path."""
        return self.spec is None

    @property
    def model_name(self) -> str:
        if self.spec is not None:
            return self.spec.id
        return self.path.name if self.path is not None else self.config.model

    def report(self, plugins: PluginManager) -> str:
        lines = [f"device      {self.device.describe()}"]
        lines.append(f"plugins     {', '.join(plugins.plugin_names())}")
        for name, why in sorted(plugins.skipped.items()):
            lines.append(f"            {name}: not loaded ({why})")
        where = str(self.path) if self.path else ("random weights" if self.config.random_weights else "(weights not found)")
        ident = self.spec.id if self.spec else f"{self.shape.family} (generic path: shape matches no registered checkpoint)"
        lines.append(f"checkpoint  {ident} from {where}")
        for c in self.choices:
            lines.append(f"{c.slot:<11} {c.name}  [{c.plugin}]" if len(c.slot) <= 11 else f"{c.slot}  {c.name}  [{c.plugin}]")
            for plugin, name, why in c.passed_over:
                lines.append(f"{'':<11}   passed over {name} [{plugin}]: {why}")
        if self.memory is not None:
            m = self.memory.as_dict()
            lines.append(
                f"memory      {m['total_gib']:.1f} GiB of {m['available_gib']:.1f} free: weights {m['weights_gib']:.1f}, "
                f"KV {m['kv_gib']:.1f}, state {m['state_gib']:.2f}, workspace {m['workspace_gib']:.1f} "
                f"(prefill chunk {self.config.prefill_chunk}, {self.config.prefill_chunk_busy} while others decode)"
            )
        lines.extend(f"note        {n}" for n in self.notes)
        lines.extend(f"PROBLEM     {n}" for n in self.problems)
        return "\n".join(lines)


def _hf_config_from_spec(spec: CheckpointSpec) -> dict[str, Any]:
    """What `ninfer_parse_config` reads for a registered checkpoint whose weights are not at hand:
    the spec's exact shape fields, tagged with its family."""
    return {"family": spec.family, **spec.shape}


def _registered(plugins: PluginManager) -> list[CheckpointSpec]:
    return plugins.collect("ninfer_checkpoints")


def _packed_quant(path: Path, config: EngineConfig) -> EngineConfig:
    """A `ninfer convert` directory was packed by one --quant recipe: plan memory and kernels for
    it, not for bf16 (the loader checks the directory itself)."""
    import json

    manifest = path / "ninfer.json"
    if not manifest.is_file():
        return config
    try:
        recipe = json.loads(manifest.read_text(encoding="utf-8")).get("recipe")
    except (OSError, ValueError, AttributeError):
        return config  # the loader reports a damaged manifest with its own message
    if recipe in ("bf16", "int4", "int8", "nvfp4"):
        return structs.replace(config, quant=recipe)
    return config


def plan(
    config: EngineConfig,
    *,
    plugins: PluginManager | None = None,
    need_weights: bool = True,
    strict: bool = True,
    held_bytes: int = 0,
) -> Plan:
    """What would run, and where. `strict=False` (the `ninfer plugins` report) keeps the problems
    on the plan instead of raising them. `held_bytes`: GPU memory this process already holds for
    the model being planned (a benchmark campaign's model, built once and reused), counted as free:
    the plan counts those weights again."""
    from ninfer import checkpoint

    plugins = plugins or get_plugin_manager()
    device = probe(config.device)
    if held_bytes and device.kind == "cuda":
        device = replace(device, free_memory=min(device.total_memory, device.free_memory + held_bytes))
    specs = _registered(plugins)
    notes: list[str] = []

    path: Path | None = None
    spec = checkpoint.find_spec(config.model, specs)
    if config.random_weights:
        if spec is None and not Path(config.model).is_dir():
            ids = ", ".join(s.id for s in specs)
            raise UserError(f"--random-weights needs a registered model id ({ids}) or a checkpoint directory.")
        hf_config = _hf_config_from_spec(spec) if spec else checkpoint.load_hf_config(Path(config.model))
    else:
        try:
            path = checkpoint.locate(config.model, config.weights).path
        except UserError:
            if need_weights or spec is None:
                raise
            notes.append(f"weights for {spec.id} not found; choices shown for its registered shape")
        hf_config = checkpoint.load_hf_config(path) if path is not None else _hf_config_from_spec(spec)
        if path is not None and config.quant == "auto":
            config = _packed_quant(path, config)

    shape = plugins.hook.ninfer_parse_config(hf_config=hf_config)
    if shape is None:
        mt = hf_config.get("model_type") or hf_config.get("text_config", {}).get("model_type")
        raise UserError(
            f"{config.model}: config.json has model_type {mt!r}, which no installed plugin runs "
            "(ninfer runs the Qwen3.5/3.6/3.8 hybrid family: qwen3_5, qwen3_5_moe)."
        )
    # (checkpoint.locate already warned when a directory's shape matches no registered checkpoint)
    spec = checkpoint.match_spec(shape, specs, path)

    # the memory plan first: its one sentence names the knobs (--max-context, --kv-dtype); it also
    # resolves the default --prefill-chunk (0) to the chunk it planned for. The busy chunk follows:
    # its default (0) is BUSY_PREFILL_CHUNK, and it is never longer than the chunk planned for.
    memory = plan_memory(shape, config, device, plugins, spec)
    busy = min(config.prefill_chunk_busy or BUSY_PREFILL_CHUNK, memory.prefill_chunk)
    if (memory.prefill_chunk, busy) != (config.prefill_chunk, config.prefill_chunk_busy):
        config = structs.replace(config, prefill_chunk=memory.prefill_chunk, prefill_chunk_busy=busy)
    problems = [memory.problem(config)] if not memory.fits else []
    if problems and strict:
        raise DeviceError(problems[0])
    problems += [p for p in plugins.collect("ninfer_validate", device=device, config=config, shape=shape) if p]
    if problems and strict:
        raise DeviceError(" ".join(problems))

    choices = [plugins.choose("ninfer_sampler", device, slot="sampler")]
    choices += _kernel_choices(plugins, config, device, shape, spec)
    if config.spec != "none":
        choices.append(choose_speculator(plugins, config, device))
    return Plan(config, device, path, hf_config, shape, spec, choices, notes, problems, memory)


def _kernel_choices(
    plugins: PluginManager, config: EngineConfig, device: DeviceInfo, shape: Any, spec: CheckpointSpec | None
) -> list[Choice]:
    """Attention backends and one linear kernel per (scheme, n, k) the model will need: chosen
    here, from the shape alone, so a kernel that cannot run on this device fails before loading."""
    from ninfer.linear import LinearFactory

    out = []
    for kind, head_dim in (("full", shape.head_dim), ("linear", getattr(shape, "linear_key_head_dim", shape.head_dim))):
        out.append(
            plugins.choose(
                "ninfer_attention_backend",
                device,
                slot=f"attention[{kind}]",
                kind=kind,
                kv_dtype=config.kv_dtype,
                head_dim=head_dim,
            )
        )
    recipe = None
    if config.quant not in ("auto", "bf16"):
        recipe = plugins.hook.ninfer_quant_recipe(quant=config.quant, shape=shape, spec=spec)
        if recipe is None:
            raise UserError(f"--quant {config.quant}: no installed plugin provides it; use --quant bf16.", param="quant")
    factory = LinearFactory(plugins, device, recipe)
    # routed experts, by layer (`{layer}.experts.{e}.gate_up_proj` / `.down_proj`): [schemes of
    # gate_up, schemes of down, experts, hidden, inner]
    banks: dict[str, list] = {}
    for name, n, k in getattr(shape, "linear_shapes", list)():
        scheme = factory.scheme_for(name, n, k)
        factory.kernel_for(scheme, n, k)
        layer, _, rest = name.partition(".experts.")
        leaf = rest.rpartition(".")[2]
        if leaf in ("gate_up_proj", "down_proj"):
            bank = banks.setdefault(layer, [set(), set(), 0, 0, 0])
            if leaf == "gate_up_proj":
                bank[0].add(scheme)
                bank[2:] = [bank[2] + 1, k, n // 2]
            else:
                bank[1].add(scheme)
    # one MoE kernel per (schemes, shape), with the slot the family's model asks it for; a layer
    # whose experts mix schemes runs the family's reference MoE without asking
    moe: dict[str, Choice] = {}
    for gu, dn, experts, hidden, inner in banks.values():
        if len(gu) != 1 or len(dn) != 1:
            continue
        slot = f"moe[{next(iter(gu))}/{next(iter(dn))} {experts}x{hidden}x{inner}]"
        if slot not in moe:
            moe[slot] = plugins.choose(
                "ninfer_moe_kernel", device, slot=slot, scheme_gate_up=next(iter(gu)), scheme_down=next(iter(dn)),
                num_experts=experts, hidden=hidden, inner=inner,
            )
    return out + list(factory.choices.values()) + list(moe.values())


def choose_speculator(plugins: PluginManager, config: EngineConfig, device: DeviceInfo) -> Choice:
    """The first `ninfer_speculators` entry named `config.spec` whose requirements hold here."""
    passed: list[tuple[str, str, str]] = []
    # asked in pluggy's order (tryfirst first), like PluginManager.choose
    for impl in reversed(plugins.pm.hook.ninfer_speculators.get_hookimpls()):
        for s in impl.function() or []:
            if getattr(s, "name", None) != config.spec:
                continue
            problem = s.requirements.problem(device) if getattr(s, "requirements", None) else None
            if problem:
                passed.append((impl.plugin_name, s.name, problem))
                continue
            return Choice("speculator", s, impl.plugin_name, passed)
    if passed:
        why = "; ".join(f"{p}:{n} {w}" for p, n, w in passed)
        raise DeviceError(f"--spec {config.spec} cannot run on {device.describe()} ({why}); use --spec none.")
    raise UserError(f"--spec {config.spec}: no installed plugin provides it; use --spec none.")


def build_engine(config: EngineConfig, *, plugins: PluginManager | None = None) -> Any:
    """Plan, load weights, build the model and its cache: a ready LLMEngine."""
    from ninfer.engine import LLMEngine
    from ninfer.frontend.chat import ChatFormat
    from ninfer.frontend.tokenizer import load_tokenizer

    plugins = plugins or get_plugin_manager()
    p = plan(config, plugins=plugins)
    config = p.config  # --quant auto resolved for a `ninfer convert` directory
    weights = None
    if p.path is not None:
        weights = plugins.hook.ninfer_load_weights(path=str(p.path), shape=p.shape, config=config, device=p.device)
        if weights is None:
            raise UserError(f"{p.path}: no installed plugin can read the weights in this directory.")
    model = plugins.hook.ninfer_model(shape=p.shape, config=config, device=p.device, weights=weights)
    if model is None:
        raise UserError(f"No installed plugin builds the {p.shape.family} family.")
    cache = model.allocate_cache(config.max_batch, config.max_context, config.kv_dtype)
    sampler = p.choices[0].impl
    speculator = None
    for c in p.choices:
        if c.slot == "speculator":
            speculator = c.impl.build(model=model, cache=cache, config=config)
    tokenizer = load_tokenizer(p.path)
    engine = LLMEngine(
        model,
        cache,
        sampler,
        tokenizer,
        max_context=config.max_context,
        prefill_chunk=config.prefill_chunk,
        prefill_chunk_busy=config.prefill_chunk_busy,
        max_batch=config.max_batch,
        speculator=speculator,
        cuda_graph=config.cuda_graph,
        info={
            "model": p.model_name,
            "registered": p.spec.id if p.spec else None,
            "path": str(p.path) if p.path else None,
            "device": p.device.describe(),
            "quant": config.quant,
        },
    )
    engine.chat = ChatFormat.from_checkpoint(p.path)
    engine.plan = p
    engine.spec = p.spec
    return engine
