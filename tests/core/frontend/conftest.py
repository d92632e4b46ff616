"""Fixtures of the frontend tests: the bundled tokenizer (loaded once) and the published template."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# the published Qwen3.6 template lives beside the repo, in ../shared (byte-exact, sha256 e84f32a2...)
PUBLISHED_TEMPLATE = REPO.parent / "shared" / "reference" / "checkpoints" / "Qwen__Qwen3.6-27B" / "chat_template.jinja"


@pytest.fixture(scope="session")
def tokenizer():
    from ninfer.frontend.tokenizer import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="session")
def published_template() -> str:
    if not PUBLISHED_TEMPLATE.is_file():
        reason = f"the published Qwen3.6 chat template is absent ({PUBLISHED_TEMPLATE} not found): cannot compare"
        print(reason)
        pytest.skip(reason)
    return PUBLISHED_TEMPLATE.read_text(encoding="utf-8")
