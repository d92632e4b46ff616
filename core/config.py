"""Typed configuration: what a checkpoint is, what a request asks for, how the engine runs.

All are msgspec Structs (frozen where shared): cheap to build, checked in `__post_init__`, and
encodable as JSON for `--json` output and the server.
"""

from __future__ import annotations

import math

import msgspec

from ninfer.errors import UserError

# the fewest tokens a sequence's cache may hold (--max-context)
MIN_CONTEXT = 16

# <|im_end|> and <|endoftext|>: generation_config.json of all three checkpoints.
DEFAULT_STOP_TOKEN_IDS: tuple[int, ...] = (248046, 248044)
# The peer (and our sampler) never keeps more than 20 candidates: spec section 7.
TOP_K_CAP = 20


class SamplingPreset(msgspec.Struct, frozen=True, kw_only=True):
    temperature: float
    top_p: float
    top_k: int
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


def preset_fields(presets: dict[str, SamplingPreset], thinking: bool) -> dict[str, float | int]:
    """The checkpoint's sampling preset for this thinking mode, as SamplingParams fields (the
    lowest layer of: preset < process flags < request fields < --greedy)."""
    preset = presets.get("thinking" if thinking else "non_thinking")
    return msgspec.structs.asdict(preset) if preset is not None else {}


class CheckpointSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A registered checkpoint: one plugin folder per id (plugins/qwen36_27b, ...)."""

    id: str
    family: str
    hf_repo_ids: tuple[str, ...]
    # Text-config fields that must match exactly for the tuned paths (hidden_size, layers, ...).
    shape: dict[str, object]
    aliases: tuple[str, ...] = ()
    # presets keyed "thinking" / "non_thinking"
    presets: dict[str, SamplingPreset] = {}
    default_quant: str = "int4"
    # sha256 of the chat_template.jinja the checkpoint ships (identity check, not a requirement)
    chat_template_sha256: str | None = None
    # parameter count of the text decoder + head (for memory planning before anything loads)
    text_params: int = 0
    mtp_params: int = 0
    description: str = ""

    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """One request's sampling; ranges and order follow spec section 7.

    temperature <= 0 means greedy: exact argmax, lowest id on ties, no penalties, no RNG.
    """

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = TOP_K_CAP
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = DEFAULT_STOP_TOKEN_IDS
    stop: tuple[str, ...] = ()
    # ignore stop ids (benchmarks that must generate exactly max_new_tokens)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> UserError:
            return UserError(f"{name} {why}", param=name)

        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise bad(name, f"must be a finite number, got {v!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise bad("temperature", f"must be in [0, 2], got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:
            raise bad("top_p", f"must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise bad("top_k", f"must be an integer, got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", f"must be a positive integer, got {self.max_new_tokens!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise bad("seed", f"must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def effective_top_k(self) -> int:
        """top_k <= 0 or >= 20 means 20: the sampler never keeps more than 20 candidates."""
        return TOP_K_CAP if self.top_k <= 0 or self.top_k >= TOP_K_CAP else self.top_k


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How one engine runs: which model, which formats, which device, how much context."""

    model: str  # registered id, alias, or a path
    weights: str | None = None
    quant: str = "auto"  # bf16 | int4 | int8 | nvfp4 | auto
    spec: str = "none"  # none | mtp | dflash
    draft_tokens: int = 3
    lm_head_draft: bool = False
    max_context: int = 4096
    # tokens a prefill step takes; 0: the largest of memory.PREFILL_CHUNKS the device fits
    # (startup.plan resolves it; 1024 on the CPU)
    prefill_chunk: int = 0
    # at most this many while other requests decode (they wait for the chunk); 0: the smaller of
    # memory.BUSY_PREFILL_CHUNK and prefill_chunk (startup.plan resolves it; never above prefill_chunk)
    prefill_chunk_busy: int = 0
    kv_dtype: str = "bf16"  # bf16 | int8 | fp8
    device: str = "auto"
    # "auto": float32 on CPU (the parity path), bfloat16 on CUDA
    dtype: str = "auto"
    cuda_graph: bool = True
    max_batch: int = 8
    random_weights: bool = False

    def __post_init__(self) -> None:
        if self.quant not in ("bf16", "int4", "int8", "nvfp4", "auto"):
            raise UserError(f"--quant {self.quant!r} is not a format: use bf16, int4, int8, nvfp4 or auto.")
        if self.spec not in ("none", "mtp", "dflash"):
            raise UserError(f"--spec {self.spec!r} is not a speculator: use none, mtp or dflash.")
        if self.kv_dtype not in ("bf16", "int8", "fp8"):
            raise UserError(f"--kv-dtype {self.kv_dtype!r} is not a KV format: use bf16, int8 or fp8.")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise UserError(f"--dtype {self.dtype!r}: use auto, float32, bfloat16 or float16.")
        if self.max_context < MIN_CONTEXT:
            raise UserError(f"--max-context must be at least {MIN_CONTEXT} tokens, got {self.max_context}.")
        if self.prefill_chunk < 0:
            raise UserError(f"--prefill-chunk must be positive (or 0 for the default), got {self.prefill_chunk}.")
        if self.prefill_chunk_busy < 0:
            raise UserError(f"--prefill-chunk-busy must be positive (or 0 for the default), got {self.prefill_chunk_busy}.")
        if self.spec == "mtp" and not 1 <= self.draft_tokens <= 5:
            raise UserError(f"--draft-tokens for mtp must be 1..5, got {self.draft_tokens}.")
        if self.spec == "dflash" and not 1 <= self.draft_tokens <= 15:
            raise UserError(f"--draft-tokens for dflash must be 1..15, got {self.draft_tokens}.")
        if not 1 <= self.max_batch <= 256:
            raise UserError(f"--max-batch must be 1..256, got {self.max_batch}.")
