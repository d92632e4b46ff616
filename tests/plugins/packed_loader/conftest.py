"""Shared by the packed_loader tests."""

from __future__ import annotations

import sys

import pytest
import structlog


class _LiveStderr:
    """Whatever sys.stderr is when a line is written."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def _logs_outlive_capsys():
    # ninfer.cli.main binds its log stream to the stderr of the moment (capsys's, in a test);
    # later tests must not log into that stream once capsys has closed it
    yield
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=_LiveStderr()))
