"""Errors a user can act on.

`UserError` carries one sentence that says what is wrong and how to fix it; the CLI prints it and
exits with code 2, the server turns it into a 4xx. Anything else escaping is a bug in ninfer.
"""

from __future__ import annotations


class UserError(Exception):
    """A request ninfer cannot serve as given: bad input, missing weights, an impossible device."""

    exit_code = 2

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class CheckpointError(UserError):
    """A checkpoint that cannot be read: missing, truncated, wrong shape, unknown layout."""

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__(message, param=tensor, code="bad_checkpoint")
        self.tensor = tensor


class DeviceError(UserError):
    """The request cannot run on this device (capability, memory, missing feature)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="device_unsupported")
