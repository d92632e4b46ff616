"""MTP speculative decoding: the checkpoint's own draft layer (`--spec mtp --draft-tokens K`).

Hookimpls: the "mtp" speculator (its `build` makes the drafter the engine's SpeculativeRound
drives) and a check, before any weight loads, that the checkpoint has an MTP layer.
Files: mtp.py (the MTP layer, its KV, the drafter), shortlist.py (the `--lm-head-draft` head and
`ninfer convert --shortlist`). Verification, acceptance and rollback are the core's
(ninfer/speculative.py): a drafter only proposes.
"""

from __future__ import annotations

from typing import Any

from ninfer import hookimpl
from ninfer.device import ANYWHERE


class MtpSpeculator:
    """`--spec mtp`: K = 1..5 point-mass drafts per round from the checkpoint's `mtp.*` layer."""

    name = "mtp"
    requirements = ANYWHERE
    max_draft_tokens = 5
    description = "the checkpoint's MTP layer (mtp.*), K = 1..5 drafts per round"

    def convert_shortlist(self, model: str, out_dir: str, rows: int, corpus: str | None = None) -> Any:
        """`ninfer convert --shortlist N [--corpus FILE]`: the head rows this drafter proposes from."""
        from ninfer_plugins.spec_mtp.shortlist import convert_shortlist

        return convert_shortlist(model, out_dir, rows, corpus)

    def build(self, model: Any, cache: Any, config: Any) -> Any:
        from ninfer_plugins.spec_mtp.mtp import MtpDrafter

        head = None
        if config.lm_head_draft:
            from ninfer.plugins import get_plugin_manager
            from ninfer_plugins.spec_mtp.shortlist import ShortlistHead, shortlist_for

            schemes = {s.name: s for s in get_plugin_manager().collect("ninfer_quant_schemes")}
            head = ShortlistHead(model, shortlist_for(model, config), schemes)
        return MtpDrafter(model, cache.num_slots, cache.max_context, config.draft_tokens, head=head, target_cache=cache)


@hookimpl
def ninfer_speculators():
    return [MtpSpeculator()]


@hookimpl
def ninfer_validate(device, config, shape):
    if config.lm_head_draft and config.spec == "none":
        return ["--lm-head-draft only changes how drafts are proposed: add --spec mtp, or drop it."]
    if config.spec != "mtp" or shape is None:
        return []
    layers = getattr(shape, "mtp_num_hidden_layers", None)
    if layers is None:
        return [f"--spec mtp runs the Qwen hybrid family's MTP layer; this {shape.family} model has none: use --spec none."]
    if layers != 1:
        return [
            f"this checkpoint's config.json declares {layers} MTP layers (mtp_num_hidden_layers); "
            "--spec mtp needs 1: use --spec none."
        ]
    return []
