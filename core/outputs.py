"""Paths a command writes, checked before its work starts: a long run must not fail at its first
(or last) write with a traceback. Each check raises UserError with one sentence."""

from __future__ import annotations

import os
from pathlib import Path

from ninfer.errors import UserError


def check_output_file(path: str | None, flag: str) -> None:
    """A file written at the end of a command: its folder must exist and be writable, and the
    path must not be a folder itself. Nothing to check without a path."""
    if not path:
        return
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    param = flag.lstrip("-")
    if target.is_dir():
        raise UserError(f"{flag} {path} is a folder; give a file path.", param=param)
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: the folder {parent} does not exist; create it or choose another path.", param=param)
    if not os.access(parent, os.W_OK):
        raise UserError(f"{flag} {path}: the folder {parent} is not writable.", param=param)


def new_folder_problem(out: Path, flag: str, command: str) -> str | None:
    """Why `command` (which never overwrites) cannot write a new folder at `out`, or None: the
    path is taken by a file or a non-empty folder, a file stands in its way, or no folder can be
    made there."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return f"{flag} {out} already exists and is not empty; choose a new directory ({command} never overwrites)."
    probe = out.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{flag} {out}: {probe} is a file, not a folder; choose another path."
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{flag} {out}: cannot create folders in {probe} (no write permission); choose another path."
    return None
