"""Errors as each API spells them.

Every failure a client can cause becomes an `ApiError` (status, message, code, param) and is
rendered in the shape of the API the request came through:

    OpenAI     {"error": {"message", "type", "param", "code"}}
    Anthropic  {"type": "error", "error": {"type", "message"}}

Codes follow the peer's server (spec section 8.3): 400 invalid_request_error with a specific code
(`unsupported_role`, `n_not_supported`, `context_length_exceeded`, ...), 401 `invalid_api_key`,
404 `model_not_found`, 413 `request_too_large`, 500 internal.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

from ninfer.errors import UserError


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    @classmethod
    def from_user_error(cls, exc: UserError) -> ApiError:
        code = None if exc.code == "invalid_request" else exc.code
        return cls(400, exc.message, code=code, param=exc.param)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "Missing or wrong API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`.",
        code="invalid_api_key",
    )


def model_not_found(model: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"The model {model!r} does not exist here: this server serves {served!r}.",
        code="model_not_found",
        param="model",
    )


def too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The request body is larger than {limit} bytes: send a smaller request.",
        code="request_too_large",
    )


def internal(message: str = "Internal server error: the request failed inside ninfer.") -> ApiError:
    return ApiError(500, message, code="internal_error")


# --- the two shapes -------------------------------------------------------------------------------

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                 405: "invalid_request_error", 413: "invalid_request_error", 503: "server_error"}  # fmt: skip
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error"}  # fmt: skip


def openai_body(err: ApiError) -> dict[str, Any]:
    kind = _OPENAI_TYPES.get(err.status, "server_error" if err.status >= 500 else "invalid_request_error")
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def anthropic_body(err: ApiError) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_body(err: ApiError, path: str) -> dict[str, Any]:
    return anthropic_body(err) if is_anthropic_path(path) else openai_body(err)


def error_response(err: ApiError, path: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        msgspec.json.encode(error_body(err, path)),
        status_code=err.status,
        media_type="application/json",
        headers=headers,
    )
