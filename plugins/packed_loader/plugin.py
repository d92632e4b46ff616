"""Pre-packed weights: `ninfer convert` directories and published NVFP4 checkpoints.

Hookimpls:
* `ninfer_load_weights` (tryfirst): answers only for a directory it recognises, before the
  family's bf16 loader: one with a `ninfer.json` (packed_dir.py: checked, then its bytes copied to
  the device), or a published NVFP4 checkpoint, ModelOpt or compressed-tensors (published.py:
  each module imported unchanged as the model asks for it). Both hand the model PackedWeights
  through `get_packed`; the model gives each linear the scheme its weight arrived in.
* `ninfer_convert`: `ninfer convert` (convert.py).

One plugin rather than a loader in each quant plugin: a converted directory mixes schemes of both
(the nvfp4 recipe keeps the head in q8_g32) and both layouts meet the model through the same seam.
Both know the Qwen hybrid family's tensor names, so they answer for its shapes only.
"""

from __future__ import annotations

from pathlib import Path

from ninfer import hookimpl


def _ours(shape) -> bool:
    from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape

    return isinstance(shape, QwenHybridShape)


@hookimpl(tryfirst=True)
def ninfer_load_weights(path, shape, config, device):
    if not _ours(shape):
        return None
    p = Path(path)
    from ninfer_plugins.packed_loader import packed_dir

    if packed_dir.is_convert_dir(p):
        from ninfer_plugins.quant_int.artifact import read_manifest

        packed_dir.check_quant_flag(p, config.quant, read_manifest(p).get("recipe"))
        return packed_dir.PackedDirSource(p, shape, device.torch_device)
    from ninfer_plugins.packed_loader import published

    quant_config = published.published_quant_config(p)
    if quant_config is None:
        return None
    published.check_quant_flag(p, config.quant)
    return published.PublishedNvfp4Source(p, shape, quant_config)


@hookimpl
def ninfer_convert(path, shape, spec, quant, out):
    if not _ours(shape):
        return None
    from ninfer_plugins.packed_loader.convert import convert

    return convert(path, shape, spec, quant, out)
