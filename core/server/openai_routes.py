"""OpenAI Chat Completions: POST /v1/chat/completions, GET /v1/models[/{id}].

Output: `message.reasoning_content` (text before `</think>`), `content`, `tool_calls` parsed from
Qwen's `<tool_call>` blocks. Streaming: a role chunk, reasoning and content as separate deltas,
each tool call as one delta when its block closes, a finish chunk, the usage chunk (empty
`choices`) when `stream_options.include_usage`, then `data: [DONE]`. With `--spec`, `usage` also
carries `ninfer_spec` {drafted, accepted, rounds, accepted_per_position} (a vendor field; the SDKs
keep it as an extra of their usage object).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
from starlette.requests import Request
from starlette.responses import Response

from ninfer.errors import UserError
from ninfer.frontend.toolcalls import new_call_id
from ninfer.server.errors import ApiError, bad_request, model_not_found, openai_body
from ninfer.server.generation import (
    Prepared,
    Run,
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
from ninfer.server.reqlog import RequestRecord
from ninfer.server.schemas import ChatCompletionRequest, decode

log = structlog.get_logger("ninfer.server")
_enc = msgspec.json.Encoder()
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# chat_template_kwargs that would collide with what the server passes to the renderer itself
_RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "template"})


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_enc.encode(body), status_code=status, media_type="application/json", headers=headers)


# --- models ---------------------------------------------------------------------------------------


def _model_entry(state: ServerState, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        import datetime

        when = datetime.datetime.fromtimestamp(state.created, datetime.UTC).isoformat().replace("+00:00", "Z")
        return {"type": "model", "id": state.model_id, "display_name": state.model_id, "created_at": when}
    return {
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "ninfer",
        "max_model_len": state.max_context,
    }


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.ninfer
    request.scope["ninfer.record"].api = "openai"
    # the Anthropic SDK lists models on the same path; it says so with its version header
    if "anthropic-version" in request.headers:
        entry = _model_entry(state, True)
        return json_response({"data": [entry], "has_more": False, "first_id": entry["id"], "last_id": entry["id"]})
    return json_response({"object": "list", "data": [_model_entry(state, False)]})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.ninfer
    request.scope["ninfer.record"].api = "openai"
    model = request.path_params["model_id"]
    if model != state.model_id:
        raise model_not_found(model, state.model_id)
    return json_response(_model_entry(state, "anthropic-version" in request.headers))


# --- request -> Prepared --------------------------------------------------------------------------


def _thinking(state: ServerState, req: ChatCompletionRequest) -> tuple[bool, bool | None, dict[str, Any]]:
    """(enable_thinking, preserve_thinking, other template kwargs) from the request's switches."""
    kwargs = dict(req.chat_template_kwargs or {})
    for key in kwargs:
        if key in _RESERVED_KWARGS:
            raise bad_request(f"chat_template_kwargs.{key} is set by the server and cannot be given.", param=f"chat_template_kwargs.{key}")

    def flag(name: str, top: Any) -> Any:
        inner = kwargs.pop(name, None)
        if inner is not None and not isinstance(inner, bool):
            raise bad_request(f"chat_template_kwargs.{name} must be true or false.", param=f"chat_template_kwargs.{name}")
        if top is not None and inner is not None and top != inner:
            raise bad_request(
                f"`{name}` and chat_template_kwargs.{name} disagree: give one of them.",
                param=name,
                code="conflicting_template_option",
            )
        return top if top is not None else inner

    thinking = flag("enable_thinking", req.enable_thinking)
    preserve = flag("preserve_thinking", req.preserve_thinking)
    effort = req.reasoning_effort
    if effort is not None:
        if effort == "none":
            if thinking is True:
                raise bad_request(
                    "reasoning_effort `none` turns thinking off but enable_thinking is true: give one of them.",
                    param="reasoning_effort",
                    code="conflicting_template_option",
                )
            thinking = False
        kwargs.setdefault("reasoning_effort", effort)
    if thinking is None:
        thinking = state.default_thinking
    return thinking, preserve, kwargs


def _tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    if req.functions is not None or req.function_call is not None:
        raise bad_request(
            "The legacy `functions`/`function_call` fields are not supported: send `tools` instead.",
            param="functions",
            code="tools_not_supported",
        )
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function" or tool.function is None:
            raise bad_request(
                f"tools[{i}]: only function tools are supported ({{\"type\": \"function\", \"function\": {{...}}}}).",
                param=f"tools[{i}]",
                code="tool_type_not_supported",
            )
        fn = tool.function
        if not TOOL_NAME.fullmatch(fn.name):
            raise bad_request(
                f"tools[{i}].function.name must be 1-64 characters of A-Z, a-z, 0-9, _ and -, got {fn.name!r}.",
                param=f"tools[{i}].function.name",
            )
        spec: dict[str, Any] = {"name": fn.name}
        if fn.description is not None:
            spec["description"] = fn.description
        if fn.parameters is not None:
            spec["parameters"] = fn.parameters
        out.append({"type": "function", "function": spec})
    return out


def _tool_choice(choice: Any) -> str:
    if choice is None:
        return "auto"
    if choice in ("auto", "none"):
        return choice
    shown = choice if isinstance(choice, str) else "a named function"
    raise bad_request(
        f"tool_choice {shown!r} is not supported (ninfer never constrains decoding to a tool): use `auto` or `none`.",
        param="tool_choice",
        code="tool_choice_not_supported",
    )


def _refuse_unsupported(req: ChatCompletionRequest) -> None:
    if req.n is not None and req.n != 1:
        raise bad_request(f"`n` must be 1 (one choice per request), got {req.n}.", param="n", code="n_not_supported")
    if req.logprobs or req.top_logprobs:
        raise bad_request("logprobs are not supported: leave `logprobs` and `top_logprobs` out.", param="logprobs", code="logprobs_not_supported")
    if req.logit_bias and any(v != 0 for v in req.logit_bias.values()):
        raise bad_request("logit_bias is not supported: leave it out.", param="logit_bias", code="logit_bias_not_supported")
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(
            f"response_format {req.response_format.type!r} is not supported: only `text`.",
            param="response_format",
            code="response_format_not_supported",
        )


def _messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(req.messages):
        if m.content is None and m.role in ("system", "developer", "user", "tool"):
            # only an assistant turn may leave content out (a turn of tool calls)
            raise bad_request(f"messages[{i}] ({m.role}) has no `content`.", param=f"messages[{i}].content")
        d: dict[str, Any] = {"role": m.role}
        if m.content is not None:
            d["content"] = m.content if isinstance(m.content, str) else [msgspec.structs.asdict(p) for p in m.content]
        reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        if reasoning is not None:
            d["reasoning_content"] = reasoning
        if m.tool_calls is not None:
            d["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


async def prepare(state: ServerState, req: ChatCompletionRequest, body_size: int) -> Prepared:
    _refuse_unsupported(req)
    tools = _tools(req)
    choice = _tool_choice(req.tool_choice)
    if choice == "none":
        tools = None  # not shown to the model, and nothing parsed as a call
    thinking, preserve, kwargs = _thinking(state, req)
    ids = await render_prompt(
        state,
        _messages(req),
        tools=tools,
        thinking=thinking,
        preserve_thinking=preserve,
        template_kwargs=kwargs,
        body_size=body_size,
    )
    if req.max_completion_tokens is not None:
        budget = max_new_tokens(state, len(ids), req.max_completion_tokens, "max_completion_tokens")
    else:
        budget = max_new_tokens(state, len(ids), req.max_tokens, "max_tokens")
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    params = sampling_params(
        state,
        thinking=thinking,
        max_tokens=budget,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=req.seed,
        stop=stop,
        ignore_eos=bool(req.ignore_eos),
    )
    prep = Prepared(new_id("chatcmpl-"), ids, params, thinking, tools, tools is not None)
    check_in_engine(state, prep)
    return prep


# --- the route ------------------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response | SSEResponse:
    state: ServerState = request.app.state.ninfer
    record: RequestRecord = request.scope["ninfer.record"]
    record.api = "openai"
    body = await read_body(request, state.max_request_bytes)
    req = decode(body, ChatCompletionRequest)
    record.model = req.model
    record.stream = bool(req.stream)
    if req.model != state.model_id:
        raise model_not_found(req.model, state.model_id)
    prep = await prepare(state, req, len(body))
    record.request_id = prep.request_id
    record.ready()
    run = Run(state, prep, record)
    headers = {"x-request-id": prep.request_id}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return SSEResponse(
            _stream(state, run, include_usage),
            keepalive=b": keep-alive\n\n",
            keepalive_s=state.keepalive_s,
            headers=headers,
            on_disconnect=record.gone,
        )
    body_out = await until_disconnect(request.receive, _complete(state, run))
    return json_response(body_out, headers=headers)


def _usage(run: Run) -> dict[str, Any]:
    f = run.final
    assert f is not None
    usage: dict[str, Any] = {
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    }
    spec = run.spec_usage()
    if spec is not None:
        usage["ninfer_spec"] = spec
    return usage


def _engine_failure(exc: BaseException, record: RequestRecord) -> ApiError:
    if isinstance(exc, UserError):
        return ApiError.from_user_error(exc)
    log.error("generation failed", request_id=record.request_id, error=str(exc))
    return ApiError(500, "The generation failed inside the engine; the request was cancelled.", code="internal_error")


async def _complete(state: ServerState, run: Run) -> dict[str, Any]:
    try:
        async for _ in run.outputs():
            pass
    except Exception as exc:  # noqa: BLE001 - an engine failure, reported in the API's shape
        raise _engine_failure(exc, run.record) from None
    ch = final_channels(run.text, run.prep, new_call_id)
    final = run.final
    assert final is not None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": ch.content if ch.content or not ch.calls else None,
        "reasoning_content": ch.reasoning or None,
    }
    if ch.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in ch.calls
        ]
    return {
        "id": run.prep.request_id,
        "object": "chat.completion",
        "created": state.created_now(),
        "model": state.model_id,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if ch.calls else final.finish_reason,
            }
        ],
        "usage": _usage(run),
    }


async def _stream(state: ServerState, run: Run, include_usage: bool) -> AsyncIterator[bytes]:
    prep = run.prep
    created = state.created_now()
    head = (
        b'data: {"id":"' + prep.request_id.encode() + b'","object":"chat.completion.chunk","created":'
        + str(created).encode() + b',"model":' + _enc.encode(state.model_id) + b',"choices":[{"index":0,"delta":'
    )  # fmt: skip
    usage_null = b',"usage":null' if include_usage else b""
    tail = b',"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"

    yield head + b'{"role":"assistant","content":""}' + tail
    channels = StreamChannels(prep, new_call_id)
    n_calls = 0
    try:
        async for out in run.outputs():
            ch = channels.push(out.text_delta, last=out.finished)
            parts = []
            if ch.reasoning:
                parts.append(head + b'{"reasoning_content":' + _enc.encode(ch.reasoning) + b"}" + tail)
            if ch.content:
                parts.append(head + b'{"content":' + _enc.encode(ch.content) + b"}" + tail)
            for call in ch.calls:
                delta = {
                    "tool_calls": [
                        {
                            "index": n_calls,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                    ]
                }
                parts.append(head + _enc.encode(delta) + tail)
                n_calls += 1
            if parts:
                yield b"".join(parts)
    except Exception as exc:  # noqa: BLE001 - the stream is open: the error goes in it
        err = _engine_failure(exc, run.record)
        run.record.error_code = err.code
        yield b"data: " + _enc.encode(openai_body(err)) + b"\n\ndata: [DONE]\n\n"
        return
    final = run.final
    assert final is not None
    finish = "tool_calls" if channels.any_calls else final.finish_reason
    end = head + b'{},"logprobs":null,"finish_reason":"' + finish.encode() + b'"}]' + usage_null + b"}\n\n"
    if include_usage:
        end += (
            b'data: {"id":"' + prep.request_id.encode() + b'","object":"chat.completion.chunk","created":'
            + str(created).encode() + b',"model":' + _enc.encode(state.model_id) + b',"choices":[],"usage":'
            + _enc.encode(_usage(run)) + b"}\n\n"
        )  # fmt: skip
    yield end + b"data: [DONE]\n\n"
