"""Finding a checkpoint and reading its tensors.

* `locate(model, weights)`: `--model PATH` or a registered id/alias -> a `ResolvedCheckpoint`.
  For an id it looks, in order, in `--weights PATH`, `$NINFER_MODELS/<id>`, and the Hugging Face
  cache (offline: `$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`); never the network.
* `WeightSource`: lazy, mmap'd reading of safetensors (one file, or shards with
  `model.safetensors.index.json`). Every header is checked when the source opens, before a byte of
  data is read, so a truncated or corrupt file fails with the file and tensor named instead of
  crashing (or silently reading garbage) later.
* `match_spec(shape, specs)`: the registered checkpoint whose exact shape this is, if any.

Safetensors only: no pickle, no `torch.load`, no remote code.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import structlog
import torch

from ninfer.config import CheckpointSpec
from ninfer.errors import CheckpointError, UserError

log = structlog.get_logger("ninfer.checkpoint")

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# A header larger than this is not a safetensors header (real ones are well under 10 MB).
MAX_HEADER_BYTES = 100 * 2**20
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


# --- config ------------------------------------------------------------------------------------


def load_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json of a checkpoint directory (or the file itself), as a dict."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise CheckpointError(f"{p} has no config.json; point --model at a Hugging Face checkpoint directory.")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e}); re-download the checkpoint's config.json.") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} holds {type(data).__name__}, not a JSON object; it is not a model config.")
    return data


# --- matching a shape to a registered checkpoint -----------------------------------------------


def _plain(value: Any) -> Any:
    """Lists and tuples compare equal when their items do (JSON gives lists, Structs tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def match_spec(
    shape: Any, specs: Iterable[CheckpointSpec], path: str | os.PathLike[str] | None = None
) -> CheckpointSpec | None:
    """The registered spec of `shape`'s family whose every pinned field equals the shape's.

    Two registered checkpoints can share a shape (Qwen3.6-27B and Qwen3.8-27B differ in weights
    and tokenizer, not geometry). Then `path` decides: a directory or HF cache entry named after
    one repo (`.../models--Qwen--Qwen3.8-27B/...`), else the checkpoint's chat_template.jinja
    identity, else the lowest id. Either answer selects the same kernels; only presets and the
    template identity differ.
    """
    family = getattr(shape, "family", None)
    found = sorted(
        (
            spec
            for spec in specs
            if spec.family == family
            and all(hasattr(shape, k) and _plain(getattr(shape, k)) == _plain(v) for k, v in spec.shape.items())
        ),
        key=lambda spec: spec.id,
    )
    if len(found) <= 1 or path is None:
        return found[0] if found else None
    where = str(Path(path).resolve()).lower().replace("--", "/").replace("__", "/")
    by_name = [s for s in found if any(r.split("/")[-1].lower() in where for r in s.hf_repo_ids) or s.id in where]
    if len(by_name) == 1:
        return by_name[0]
    template = Path(path) / "chat_template.jinja"
    if template.is_file():
        import hashlib

        digest = hashlib.sha256(template.read_bytes()).hexdigest()
        by_template = [s for s in found if s.chat_template_sha256 == digest]
        if len(by_template) == 1:
            return by_template[0]
    return (by_name or found)[0]


def find_spec(model: str, specs: Iterable[CheckpointSpec]) -> CheckpointSpec | None:
    """The spec registered under `model` (id, alias or HF repo id; case-insensitive)."""
    key = model.strip().lower()
    for spec in specs:
        if key in (n.lower() for n in (*spec.names(), *spec.hf_repo_ids)):
            return spec
    return None


# --- locating ----------------------------------------------------------------------------------


@dataclass
class ResolvedCheckpoint:
    path: Path  # the directory holding config.json and the safetensors
    hf_config: dict[str, Any]
    spec: CheckpointSpec | None  # the registered spec when the shape matches one exactly
    shape: Any  # the family's shape object (ninfer_parse_config), None if no family claims it
    found_in: str  # "--model", "--weights", "$NINFER_MODELS", "Hugging Face cache"
    looked: list[str] = field(default_factory=list)

    @property
    def generic(self) -> bool:
        """True when the shape matches no registered checkpoint (runs on the generic path)."""
        return self.spec is None


def hf_cache_roots() -> list[Path]:
    """The Hugging Face hub cache directories, in the order huggingface_hub itself consults them."""
    roots: list[Path] = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]) / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    out: list[Path] = []
    for r in roots:
        r = r.expanduser()
        if r not in out:
            out.append(r)
    return out


def _hf_snapshot(root: Path, repo_id: str) -> tuple[Path | None, str]:
    """The snapshot dir `refs/main` points at (else the newest snapshot), and what was seen."""
    repo_dir = root / ("models--" + repo_id.replace("/", "--"))
    if not repo_dir.is_dir():
        return None, f"{repo_dir} (not there)"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap, str(snap)
    snaps = sorted((p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not snaps:
        return None, f"{repo_dir} (no snapshots)"
    return snaps[-1], str(snaps[-1])


def _usable(path: Path) -> str | None:
    """Why `path` is not a checkpoint directory, or None when it looks like one."""
    if not path.is_dir():
        return "not there"
    if not (path / "config.json").is_file():
        return "no config.json"
    if not (path / INDEX_NAME).is_file() and not any(path.glob("*.safetensors")):
        return "no .safetensors files"
    return None


def _parse_and_match(path: Path, specs: list[CheckpointSpec], plugins: Any) -> tuple[dict, Any, CheckpointSpec | None]:
    cfg = load_hf_config(path)
    shape = plugins.hook.ninfer_parse_config(hf_config=cfg) if plugins is not None else None
    if shape is None:
        raise CheckpointError(
            f"{path}/config.json describes model_type {cfg.get('model_type')!r}, which no installed plugin "
            "runs; ninfer runs the Qwen3.5/3.6/3.8 hybrid family (see `ninfer plugins`)."
        )
    return cfg, shape, match_spec(shape, specs, path)


def locate(
    model: str,
    weights: str | None = None,
    *,
    specs: list[CheckpointSpec] | None = None,
    plugins: Any = None,
) -> ResolvedCheckpoint:
    """Resolve `--model` (a path or a registered id) and `--weights` to a checkpoint directory.

    `specs` and `plugins` default to the process-wide plugin manager's registered checkpoints
    and hooks. Raises UserError listing every place looked when nothing is found.
    """
    if plugins is None:
        from ninfer.plugins import get_plugin_manager

        plugins = get_plugin_manager()
    if specs is None:
        specs = plugins.collect("ninfer_checkpoints")
    as_path = Path(model).expanduser()
    spec = find_spec(model, specs)
    if spec is None:
        looks_like_path = as_path.exists() or os.sep in model or model.startswith((".", "~"))
        if not looks_like_path:
            ids = ", ".join(sorted(s.id for s in specs)) or "none (no checkpoint plugin installed)"
            raise UserError(
                f"--model {model!r} is neither a directory nor a registered checkpoint; registered ids: {ids}.",
                param="model",
            )
        why = _usable(as_path)
        if why == "not there":
            raise UserError(f"--model {model}: no such directory.", param="model")
        if why == "no config.json":
            raise CheckpointError(
                f"{as_path} has no config.json; point --model at a Hugging Face checkpoint directory."
            )
        weights_dir = Path(weights).expanduser() if weights else as_path
        if weights and _usable(weights_dir):
            raise UserError(f"--weights {weights}: {_usable(weights_dir)}.", param="weights")
        cfg, shape, matched = _parse_and_match(as_path, specs, plugins)
        found = ResolvedCheckpoint(weights_dir, cfg, matched, shape, "--model", [str(as_path)])
        if matched is None:
            from ninfer.testing import embedded_tiny_dir

            # the README's default (the embedded tiny model) is this on purpose: no warning for it
            say = log.info if as_path.resolve() == embedded_tiny_dir().resolve() else log.warning
            say("shape matches no registered checkpoint: running on the generic path", path=str(as_path),
                family=getattr(shape, "family", None))
        return found

    candidates: list[tuple[str, Path | None, str]] = []
    if weights:
        p = Path(weights).expanduser()
        candidates.append(("--weights", p, str(p)))
    if os.environ.get("NINFER_MODELS"):
        p = Path(os.environ["NINFER_MODELS"]).expanduser() / spec.id
        candidates.append(("$NINFER_MODELS", p, str(p)))
    for root in hf_cache_roots():
        for repo in spec.hf_repo_ids:
            snap, seen = _hf_snapshot(root, repo)
            candidates.append(("Hugging Face cache", snap, seen))
    looked: list[str] = []
    for origin, path, seen in candidates:
        why = _usable(path) if path is not None else None
        if path is None or why:
            looked.append(seen if path is None else f"{seen} ({why})")
            continue
        cfg, shape, matched = _parse_and_match(path, specs, plugins)
        if matched is None or matched.id != spec.id:
            log.warning(
                "checkpoint found for a registered id does not have its shape: running on the generic path",
                id=spec.id, path=str(path),
            )
            matched = None
        return ResolvedCheckpoint(path, cfg, matched, shape, origin, looked + [str(path)])
    repo = spec.hf_repo_ids[0] if spec.hf_repo_ids else spec.id
    raise UserError(
        f"No weights found for {spec.id}; looked in: " + "; ".join(looked) + ". "
        f"Download {repo} (e.g. `huggingface-cli download {repo}`) or pass --weights DIR.",
        param="model",
    )


# --- reading tensors ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]


def read_safetensors_header(file: Path) -> dict[str, TensorInfo]:
    """Parse and check a safetensors header without touching the data.

    Checks: the 8-byte length fits in the file, the header is a JSON object, every tensor's byte
    range lies inside the file and matches its dtype and shape.
    """
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"{file} is truncated ({size} bytes: not even a safetensors header); re-download it."
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(
                    f"{file} is truncated or corrupt: its header claims {n} bytes but the file has {size}; "
                    "re-download it."
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{file} cannot be read ({e.strerror}).") from e
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{file} has a corrupt safetensors header (not a JSON object: {e}); re-download it."
        ) from e
    data_bytes = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = meta["dtype"], tuple(int(d) for d in meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"{file}: tensor {name} has a malformed header entry; re-download the file.", tensor=name
            ) from e
        elems = 1
        for d in shape:
            elems *= d
        width = DTYPE_BYTES.get(dtype)
        if width is None:
            raise CheckpointError(f"{file}: tensor {name} has unknown dtype {dtype!r}.", tensor=name)
        if not 0 <= begin <= end:
            raise CheckpointError(f"{file}: tensor {name} has bad data offsets [{begin}, {end}).", tensor=name)
        if end > data_bytes:
            raise CheckpointError(
                f"{file} is truncated: tensor {name} needs bytes up to {end} but the data section has {data_bytes}; "
                "re-download the file.",
                tensor=name,
            )
        # F4 packs two values per byte; other dtypes are whole bytes per element
        expect = (elems + 1) // 2 if dtype == "F4" else elems * width
        if end - begin != expect:
            raise CheckpointError(
                f"{file}: tensor {name} {dtype}{list(shape)} should take {expect} bytes, "
                f"its header gives {end - begin}.",
                tensor=name,
            )
        out[name] = TensorInfo(file, dtype, shape)
    return out


class WeightSource:
    """Tensors of a safetensors checkpoint by name, read lazily (mmap) on `get`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._tensors: dict[str, TensorInfo] = {}
        self._handles: dict[Path, Any] = {}
        files = self._files()
        headers = {f: read_safetensors_header(f) for f in files}
        index = self.path / INDEX_NAME if self.path.is_dir() else None
        if index is not None and index.is_file():
            for name, file in self._weight_map(index).items():
                if name not in headers[file]:
                    raise CheckpointError(
                        f"{index} puts tensor {name} in {file.name}, but that file has no such tensor; "
                        "the checkpoint is incomplete or mixed from two versions.",
                        tensor=name,
                    )
                self._tensors[name] = headers[file][name]
        else:
            for file, tensors in headers.items():
                for name, info in tensors.items():
                    if name in self._tensors:
                        raise CheckpointError(
                            f"tensor {name} is in both {self._tensors[name].file.name} and {file.name}; "
                            "without an index the checkpoint is ambiguous.",
                            tensor=name,
                        )
                    self._tensors[name] = info

    def _weight_map(self, index: Path) -> dict[str, Path]:
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            wmap = data["weight_map"]
            if not isinstance(wmap, dict):
                raise ValueError("weight_map is not an object")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index} is corrupt ({e}); re-download it.") from e
        return {name: self.path / shard for name, shard in wmap.items()}

    def _files(self) -> list[Path]:
        p = self.path
        if p.is_file():
            return [p]
        if not p.is_dir():
            raise CheckpointError(f"{p}: no such checkpoint directory.")
        index = p / INDEX_NAME
        if index.is_file():
            wmap = self._weight_map(index)
            files = sorted(set(wmap.values()))
            for f in files:
                if not f.is_file():
                    tensor = next(n for n, s in wmap.items() if s == f)
                    raise CheckpointError(
                        f"{index.name} lists shard {f.name} (holding {tensor} and others) but {f} is missing; "
                        "re-download the checkpoint.",
                        tensor=tensor,
                    )
            return files
        if (p / SINGLE_NAME).is_file():
            return [p / SINGLE_NAME]
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{p} holds no .safetensors files (ninfer reads safetensors only).")
        return files

    # --- queries ---------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._tensors)

    def has(self, name: str) -> bool:
        return name in self._tensors

    def info(self, name: str) -> TensorInfo:
        if name not in self._tensors:
            raise CheckpointError(f"{self.path}: the checkpoint has no tensor {name}.", tensor=name)
        return self._tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The tensor as stored (dtype unchanged), after checking it has `shape` when given."""
        info = self.info(name)
        if shape is not None and tuple(shape) != info.shape:
            raise CheckpointError(
                f"{info.file.name}: tensor {name} has shape {list(info.shape)}, the model expects {list(shape)}; "
                "the checkpoint does not match its config.json.",
                tensor=name,
            )
        handle = self._handles.get(info.file)
        if handle is None:
            from safetensors import safe_open

            handle = self._handles[info.file] = safe_open(str(info.file), framework="pt")
        return handle.get_tensor(name)

    def close(self) -> None:
        self._handles.clear()

    def __repr__(self) -> str:
        return f"WeightSource({self.path}, {len(self._tensors)} tensors)"
