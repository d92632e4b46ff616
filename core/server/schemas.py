"""Request bodies of both APIs as msgspec Structs.

Decoding with the Struct checks JSON syntax, the top-level object, every field's type and the
required fields in one pass, and names the offending field (`$.messages[0].content`), which
becomes the error's `param`. Range checks and the rules msgspec cannot express (roles, which
tool_choice values exist, thinking options) are in the route modules. Unknown fields are ignored,
as the official servers do, so newer clients keep working; fields that would change the answer
and that ninfer does not implement are declared here so that they can be refused explicitly.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ninfer.server.errors import ApiError

# --- OpenAI: POST /v1/chat/completions ------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class FunctionCallIn(msgspec.Struct, kw_only=True):
    name: str
    # OpenAI sends a JSON string; some clients send the object itself
    arguments: str | dict[str, Any] | None = None


class ToolCallIn(msgspec.Struct, kw_only=True):
    function: FunctionCallIn
    id: str | None = None
    type: str = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # the name some clients (and vLLM) use for the same field
    reasoning: str | None = None
    refusal: str | None = None


class FunctionDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(msgspec.Struct, kw_only=True):
    type: str = "function"
    function: FunctionDef | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str


class ChatCompletionRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # thinking switches: the top-level extension and the template's own kwargs
    enable_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    preserve_thinking: bool | None = None
    # refused unless neutral: ninfer does not compute them
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    # accepted and ignored
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # vLLM's extension: generate exactly max_tokens (benchmarks)
    ignore_eos: bool | None = None


# --- Anthropic: POST /v1/messages, /v1/messages/count_tokens --------------------------------------


class Block(msgspec.Struct, kw_only=True):
    """Any content block; which fields must be present depends on `type` (checked on use)."""

    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    source: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


class AnthropicMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[Block]


class AnthropicTool(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None


class ThinkingConfig(msgspec.Struct, kw_only=True):
    type: str
    budget_tokens: int | None = None


class AnthropicToolChoice(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[AnthropicMessage]
    # required by /v1/messages, absent from count_tokens: checked in the route
    max_tokens: int | None = None
    system: str | list[Block] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    thinking: ThinkingConfig | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


# --- decoding -------------------------------------------------------------------------------------

_AT = re.compile(r" - at `\$\.?(.*)`$")
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}


def decode(body: bytes, kind: type[msgspec.Struct]) -> Any:
    """Parse and type-check a request body; ApiError 400 naming the field on any problem."""
    dec = _DECODERS.get(kind)
    if dec is None:
        dec = _DECODERS[kind] = msgspec.json.Decoder(kind)
    if not body.strip():
        raise ApiError(400, "The request body is empty: send a JSON object.", code="invalid_json")
    try:
        return dec.decode(body)
    except msgspec.ValidationError as e:
        text = str(e)
        m = _AT.search(text)
        param = m.group(1) or None if m else None
        what = text[: m.start()] if m else text
        where = f" at `{param}`" if param else ""
        raise ApiError(400, f"Invalid request{where}: {what}.", param=param) from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"The request body is not valid JSON: {e}.", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "The request body nests too deeply: flatten it.", code="invalid_json") from None
