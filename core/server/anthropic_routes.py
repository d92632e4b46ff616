"""Anthropic Messages: POST /v1/messages and POST /v1/messages/count_tokens.

The conversation is mapped onto the chat format's messages: `system` -> a system message,
thinking blocks -> `reasoning_content`, tool_use blocks -> `tool_calls`, tool_result blocks ->
tool messages (rendered by the template as `<tool_response>`). `model` is an echoed label, not
checked (spec section 8.3). Thinking follows the server default unless `thinking.type` says
`enabled`/`adaptive` or `disabled`.

Streaming events: message_start, ping, then per block content_block_start, content_block_delta
(thinking_delta | text_delta | input_json_delta), content_block_stop; then message_delta (stop
reason, usage) and message_stop. Stop reasons: a stop token -> end_turn, a stop sequence ->
stop_sequence (with the sequence), the budget -> max_tokens, tool calls -> tool_use. With `--spec`,
the final usage (message, message_delta) also carries the vendor field `ninfer_spec`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ninfer.server.errors import anthropic_body, bad_request
from ninfer.server.generation import (
    Prepared,
    Run,
    MAX_STOPS,
    ServerState,
    StreamChannels,
    check_in_engine,
    final_channels,
    max_new_tokens,
    new_id,
    render_prompt,
    sampling_params,
)
from ninfer.server.lifecycle import SSEResponse, read_body, until_disconnect
from ninfer.server.openai_routes import TOOL_NAME, _engine_failure, json_response
from ninfer.server.reqlog import RequestRecord
from ninfer.server.schemas import Block, MessagesRequest, decode

_enc = msgspec.json.Encoder()
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def tool_use_id() -> str:
    return new_id("toolu_")


# --- request -> chat messages ---------------------------------------------------------------------


def _text_of(content: str | list[Block] | None, where: str) -> str:
    """Text of a system prompt or a tool result: a string or text blocks only."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for j, b in enumerate(content):
        if b.type != "text" or b.text is None:
            raise bad_request(
                f"{where}[{j}]: only text blocks are supported here, got {b.type!r}.",
                param=f"{where}[{j}]",
            )
        parts.append(b.text)
    return "\n".join(parts)


def _blocks(content: str | list[Block]) -> list[Block]:
    return [Block(type="text", text=content)] if isinstance(content, str) else content


def _user_turn(blocks: list[Block], w: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": list(texts)})
            texts.clear()

    for j, b in enumerate(blocks):
        bw = f"{w}.content[{j}]"
        if b.type == "text":
            if b.text is None:
                raise bad_request(f"{bw}: a text block needs a string `text`.", param=f"{bw}.text")
            texts.append({"type": "text", "text": b.text})
        elif b.type == "tool_result":
            if b.tool_use_id is None:
                raise bad_request(f"{bw}: a tool_result block needs `tool_use_id`.", param=f"{bw}.tool_use_id")
            flush()
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": _text_of(b.content, f"{bw}.content")})
        elif b.type in ("image", "document", "search_result"):
            raise bad_request(f"{bw}: {b.type} blocks are not supported yet: send text.", param=f"{bw}.type")
        else:
            raise bad_request(
                f"{bw}: a user message takes text and tool_result blocks, not {b.type!r}.", param=f"{bw}.type"
            )
    flush()
    if not out:  # an empty turn still is a turn
        out.append({"role": "user", "content": ""})
    return out


def _assistant_turn(blocks: list[Block], w: str) -> dict[str, Any]:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        bw = f"{w}.content[{j}]"
        if b.type == "text":
            if b.text is None:
                raise bad_request(f"{bw}: a text block needs a string `text`.", param=f"{bw}.text")
            text.append(b.text)
        elif b.type == "thinking":
            if b.thinking is None:
                raise bad_request(f"{bw}: a thinking block needs a string `thinking`.", param=f"{bw}.thinking")
            reasoning.append(b.thinking)
        elif b.type == "redacted_thinking":
            continue  # opaque to us: nothing to render
        elif b.type == "tool_use":
            if b.name is None or not TOOL_NAME.fullmatch(b.name):
                raise bad_request(f"{bw}: a tool_use block needs a valid `name`.", param=f"{bw}.name")
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input or {}}})
        else:
            raise bad_request(
                f"{bw}: an assistant message takes text, thinking and tool_use blocks, not {b.type!r}.",
                param=f"{bw}.type",
            )
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _conversation(req: MessagesRequest) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if req.system is not None:
        system = _text_of(req.system, "system")
        if system:
            msgs.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        w = f"messages[{i}]"
        if m.role == "user":
            msgs += _user_turn(_blocks(m.content), w)
        elif m.role == "assistant":
            msgs.append(_assistant_turn(_blocks(m.content), w))
        else:
            raise bad_request(
                f"{w}.role is {m.role!r}: use user or assistant (the system prompt goes in `system`).",
                param=f"{w}.role",
                code="unsupported_role",
            )
    return msgs


def _tools(req: MessagesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for i, t in enumerate(req.tools):
        if t.type not in (None, "custom"):
            raise bad_request(
                f"tools[{i}]: server tools ({t.type!r}) are not supported: define client tools with `input_schema`.",
                param=f"tools[{i}].type",
                code="tool_type_not_supported",
            )
        if not TOOL_NAME.fullmatch(t.name):
            raise bad_request(
                f"tools[{i}].name must be 1-64 characters of A-Z, a-z, 0-9, _ and -, got {t.name!r}.",
                param=f"tools[{i}].name",
            )
        fn: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            fn["description"] = t.description
        fn["parameters"] = t.input_schema if t.input_schema is not None else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def _thinking(state: ServerState, req: MessagesRequest) -> bool:
    if req.thinking is None:
        return state.default_thinking
    kind = req.thinking.type
    if kind in ("enabled", "adaptive"):
        return True
    if kind == "disabled":
        return False
    raise bad_request(f"thinking.type {kind!r}: use enabled or disabled.", param="thinking.type")


async def _prompt(state: ServerState, req: MessagesRequest, body_size: int) -> tuple[list[int], bool, list[dict[str, Any]] | None]:
    tools = _tools(req)
    if req.tool_choice is not None:
        kind = req.tool_choice.type
        if kind == "none":
            tools = None
        elif kind != "auto":
            raise bad_request(
                f"tool_choice {kind!r} is not supported (ninfer never constrains decoding to a tool): use auto or none.",
                param="tool_choice.type",
                code="tool_choice_not_supported",
            )
    thinking = _thinking(state, req)
    ids = await render_prompt(state, _conversation(req), tools=tools, thinking=thinking, body_size=body_size)
    return ids, thinking, tools


async def _prepare(state: ServerState, req: MessagesRequest, body_size: int) -> Prepared:
    if req.max_tokens is None:
        raise bad_request("`max_tokens` is required.", param="max_tokens")
    ids, thinking, tools = await _prompt(state, req, body_size)
    budget = max_new_tokens(state, len(ids), req.max_tokens, "max_tokens")
    params = sampling_params(
        state,
        thinking=thinking,
        max_tokens=budget,
        temperature=req.temperature,
        temperature_max=1.0,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=req.stop_sequences,
        max_stops=MAX_STOPS["anthropic"],
    )
    prep = Prepared(new_id("msg_"), ids, params, thinking, tools, tools is not None)
    check_in_engine(state, prep)
    return prep


# --- routes ---------------------------------------------------------------------------------------


async def _read(request: Request) -> tuple[ServerState, RequestRecord, MessagesRequest, int]:
    state: ServerState = request.app.state.ninfer
    record: RequestRecord = request.scope["ninfer.record"]
    record.api = "anthropic"
    body = await read_body(request, state.max_request_bytes)
    req = decode(body, MessagesRequest)
    record.model = req.model
    return state, record, req, len(body)


async def count_tokens(request: Request) -> Response:
    state, record, req, size = await _read(request)
    ids, _, _ = await _prompt(state, req, size)
    record.prompt_tokens = len(ids)
    return json_response({"input_tokens": len(ids)})


async def messages(request: Request) -> Response | SSEResponse:
    state, record, req, size = await _read(request)
    record.stream = bool(req.stream)
    prep = await _prepare(state, req, size)
    record.request_id = prep.request_id
    record.ready()
    run = Run(state, prep, record)
    headers = {"x-request-id": prep.request_id}
    if req.stream:
        return SSEResponse(
            _stream(run, req.model),
            keepalive=PING,
            keepalive_s=state.keepalive_s,
            headers=headers,
            on_disconnect=record.gone,
        )
    out = await until_disconnect(request.receive, _complete(run, req.model))
    return json_response(out, headers=headers)


def _stop(run: Run, any_calls: bool) -> tuple[str, str | None]:
    final = run.final
    assert final is not None
    if any_calls:
        return "tool_use", None
    if final.finish_reason == "length":
        return "max_tokens", None
    seq = run.stop_string()
    return ("stop_sequence", seq) if seq is not None else ("end_turn", None)


def _message(run: Run, model: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None], output_tokens: int) -> dict[str, Any]:
    return {
        "id": run.prep.request_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": _usage(run, len(run.prep.prompt_ids), output_tokens),
    }


def _usage(run: Run, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    spec = run.spec_usage()
    if spec is not None:
        usage["ninfer_spec"] = spec  # a vendor field: the SDKs keep unknown usage fields as extras
    return usage


async def _complete(run: Run, model: str) -> dict[str, Any]:
    try:
        async for _ in run.outputs():
            pass
    except Exception as exc:  # noqa: BLE001 - an engine failure, reported in the API's shape
        raise _engine_failure(exc, run.record) from None
    ch = final_channels(run.text, run.prep, tool_use_id)
    content: list[dict[str, Any]] = []
    if ch.reasoning:
        content.append({"type": "thinking", "thinking": ch.reasoning, "signature": ""})
    if ch.content:
        content.append({"type": "text", "text": ch.content})
    for c in ch.calls:
        content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input})
    assert run.final is not None
    return _message(run, model, content, _stop(run, bool(ch.calls)), run.final.completion_tokens)


def _event(name: str, payload: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _enc.encode(payload) + b"\n\n"


class _Blocks:
    """Opens and closes content blocks as the channel of the deltas changes."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def start(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self.stop()
        self.index += 1
        self.open = kind
        return out + _event("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})

    def stop(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def delta(self, kind: str, field: str, text: str) -> bytes:
        out = b""
        if self.open != kind:
            empty = {"type": kind, kind: "", "signature": ""} if kind == "thinking" else {"type": kind, kind: ""}
            out = self.start(kind, empty)
        return out + (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":' + str(self.index).encode()
            + b',"delta":{"type":"' + field.encode() + b'","' + kind.encode() + b'":' + _enc.encode(text) + b"}}\n\n"
        )  # fmt: skip


async def _stream(run: Run, model: str) -> AsyncIterator[bytes]:
    start = _message(run, model, [], (None, None), 0)
    yield _event("message_start", {"type": "message_start", "message": start}) + PING
    channels = StreamChannels(run.prep, tool_use_id)
    blocks = _Blocks()
    try:
        async for out in run.outputs():
            ch = channels.push(out.text_delta, last=out.finished)
            parts = []
            if ch.reasoning:
                parts.append(blocks.delta("thinking", "thinking_delta", ch.reasoning))
            if ch.content:
                parts.append(blocks.delta("text", "text_delta", ch.content))
            for call in ch.calls:
                parts.append(blocks.start("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}))
                parts.append(
                    _event(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": blocks.index,
                            "delta": {"type": "input_json_delta", "partial_json": call.arguments},
                        },
                    )
                )
                parts.append(blocks.stop())
            if parts:
                yield b"".join(parts)
    except Exception as exc:  # noqa: BLE001 - the stream is open: the error goes in it
        err = _engine_failure(exc, run.record)
        run.record.error_code = err.code
        yield blocks.stop() + _event("error", anthropic_body(err))
        return
    final = run.final
    assert final is not None
    reason, seq = _stop(run, channels.any_calls)
    yield blocks.stop() + _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": _usage(run, final.prompt_tokens, final.completion_tokens),
        },
    ) + _event("message_stop", {"type": "message_stop"})

