"""Tiny checkpoints with an MTP layer (fp32, vocab 256), shared by the spec_mtp tests."""

from __future__ import annotations

import pytest
from spec_helpers import VOCAB

from ninfer.frontend.tokenizer import load_tokenizer
from ninfer.testing import load_model, make_tiny


@pytest.fixture(scope="session")
def tok():
    return load_tokenizer(None)


@pytest.fixture(scope="session")
def dense(tmp_path_factory):
    return load_model(make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("dense"), vocab=VOCAB, layers=4), spec="mtp")


@pytest.fixture(scope="session")
def moe(tmp_path_factory):
    return load_model(make_tiny("qwen3.6-35b-a3b", tmp_path_factory.mktemp("moe"), vocab=VOCAB, seed=2), spec="mtp")
