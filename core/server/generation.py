"""What both APIs share: prompt building, sampling parameters, and the output channels.

A request becomes a `Prepared` (prompt ids, SamplingParams, thinking on/off, the tools the output
may call), runs as a `Run` (the engine stream plus what the log and the finish mapping need), and
its text is split into reasoning, content and tool calls: by `StreamChannels` delta by delta when
streaming, by `final_channels` on the whole text otherwise. The two agree: the streaming splitter
and tool parser emit exactly what the batch functions return (the frontend tests this), so a
stream's concatenated deltas equal the non-streaming answer.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ninfer.config import SamplingParams, preset_fields
from ninfer.errors import UserError
from ninfer.frontend.reasoning import ReasoningSplitter, split_reasoning
from ninfer.frontend.toolcalls import ToolCall, ToolCallStream, parse_tool_calls
from ninfer.request import RequestOutput
from ninfer.server.errors import ApiError, bad_request
from ninfer.server.reqlog import RequestRecord

# Rendering and tokenizing a prompt larger than this leaves the event loop, so that other streams
# do not stall behind it: 64 KiB of text takes 1.6 ms, 1 MiB 21 ms (bundled tokenizer, CI box).
OFFLOAD_BYTES = 64 * 1024
# OpenAI's limit; Anthropic clients send a few more at times
MAX_STOPS = {"openai": 4, "anthropic": 16}


class ServerState:
    """The resident engine and the server's settings, shared by every route."""

    def __init__(
        self,
        engine: Any,
        *,
        model_id: str,
        api_key: str | None,
        default_thinking: bool,
        default_max_tokens: int,
        max_request_bytes: int,
        keepalive_s: float,
        logger: Any,
    ) -> None:
        self.engine = engine  # AsyncEngine
        llm = engine.engine
        self.llm = llm
        self.tokenizer = llm.tokenizer
        chat = getattr(llm, "chat", None)
        if chat is None:
            from ninfer.frontend.chat import ChatFormat

            chat = ChatFormat()
        self.chat = chat
        spec = getattr(llm, "spec", None)
        self.presets = dict(spec.presets) if spec is not None else {}
        self.max_context = llm.max_context
        self.model_id = model_id
        self.api_key = api_key.encode("utf-8") if api_key else None
        self.default_thinking = default_thinking
        self.default_max_tokens = default_max_tokens
        self.max_request_bytes = max_request_bytes
        self.keepalive_s = keepalive_s
        self.logger = logger
        self.created = int(time.time())

    @staticmethod
    def created_now() -> int:
        return int(time.time())

    def engine_alive(self) -> bool:
        """False once the engine thread died (the server then answers /health with 503)."""
        thread = getattr(self.engine, "_thread", None)
        return thread is None or thread.is_alive()


@dataclass
class Prepared:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    thinking: bool
    # tools whose calls are parsed out of the content (None: the text stays text)
    tools: list[dict[str, Any]] | None
    parse_tools: bool


# --- building the request -------------------------------------------------------------------------


async def render_prompt(
    state: ServerState,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    thinking: bool,
    preserve_thinking: bool | None = None,
    template_kwargs: dict[str, Any] | None = None,
    body_size: int = 0,
) -> list[int]:
    def work() -> list[int]:
        try:
            text = state.chat.render(
                messages,
                tools=tools,
                enable_thinking=thinking,
                preserve_thinking=preserve_thinking,
                **(template_kwargs or {}),
            )
        except RecursionError:
            raise bad_request("A message or tool schema nests too deeply: flatten it.") from None
        return state.tokenizer.encode(text)

    if body_size > OFFLOAD_BYTES:
        return await asyncio.to_thread(work)
    return work()


def max_new_tokens(state: ServerState, prompt_len: int, requested: int | None, param: str) -> int:
    """The generation budget; 400 context_length_exceeded naming both counts when it cannot fit."""
    ctx = state.max_context
    if requested is not None and (isinstance(requested, bool) or requested < 1):
        raise bad_request(f"`{param}` must be a positive integer, got {requested}.", param=param)
    if prompt_len >= ctx:
        raise ApiError(
            400,
            f"The prompt has {prompt_len} tokens but the context holds {ctx}: shorten the conversation.",
            code="context_length_exceeded",
            param="messages",
        )
    room = ctx - prompt_len
    if requested is None:
        return min(state.default_max_tokens, room)
    if requested > room:
        raise ApiError(
            400,
            f"The prompt has {prompt_len} tokens and `{param}` asks for {requested} more, "
            f"{prompt_len + requested} in all, but the context holds {ctx}: "
            f"ask for at most {room} tokens or shorten the conversation.",
            code="context_length_exceeded",
            param=param,
        )
    return requested


def _number(name: str, value: Any, lo: float, hi: float) -> float:
    if not math.isfinite(value) or not lo <= value <= hi:
        raise bad_request(f"`{name}` must be between {lo:g} and {hi:g}, got {value}.", param=name)
    return float(value)


def sampling_params(
    state: ServerState,
    *,
    thinking: bool,
    max_tokens: int,
    temperature: float | None = None,
    temperature_max: float = 2.0,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    seed: int | None = None,
    stop: list[str] | None = None,
    max_stops: int = MAX_STOPS["openai"],
    ignore_eos: bool = False,
) -> SamplingParams:
    """The checkpoint's preset for this thinking mode < the request's fields (spec section 7)."""
    fields: dict[str, Any] = preset_fields(state.presets, thinking)
    if temperature is not None:
        fields["temperature"] = _number("temperature", temperature, 0.0, temperature_max)
    if top_p is not None:
        fields["top_p"] = _number("top_p", top_p, 0.0, 1.0)
    if min_p is not None:
        fields["min_p"] = _number("min_p", min_p, 0.0, 1.0)
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if value is not None:
            fields[name] = _number(name, value, -2.0, 2.0)
    if top_k is not None:
        # -1 and 0 mean "no limit" in the wild; the sampler keeps at most 20 candidates anyway
        if top_k < -1:
            raise bad_request(f"`top_k` must be -1, 0 or a positive integer, got {top_k}.", param="top_k")
        fields["top_k"] = top_k
    if seed is None:
        seed = secrets.randbits(63)  # a fresh draw per request when the client does not pin one
    elif not -(2**63) <= seed < 2**64:
        raise bad_request(f"`seed` must fit in 64 bits, got {seed}.", param="seed")
    stops = list(stop or ())
    if len(stops) > max_stops:
        raise bad_request(f"At most {max_stops} stop strings are allowed, got {len(stops)}.", param="stop")
    if any(not s for s in stops):
        raise bad_request("Stop strings must not be empty.", param="stop")
    try:
        return SamplingParams(
            **fields,
            seed=seed % 2**63,
            max_new_tokens=max_tokens,
            stop_token_ids=tuple(state.tokenizer.stop_ids),
            stop=tuple(dict.fromkeys(stops)),
            ignore_eos=bool(ignore_eos),
        )
    except UserError as e:
        raise ApiError.from_user_error(e) from None


def check_in_engine(state: ServerState, prep: Prepared) -> None:
    """The engine's own admission check, here so that it fails as a 4xx before any byte is sent."""
    try:
        state.llm.check_request(prep.prompt_ids, prep.params)
    except UserError as e:
        raise ApiError.from_user_error(e) from None


# --- running it -----------------------------------------------------------------------------------


class Run:
    """The engine stream of one request, keeping what the answer's end needs."""

    def __init__(self, state: ServerState, prep: Prepared, record: RequestRecord) -> None:
        self.state = state
        self.prep = prep
        self.record = record
        self.ids: list[int] = []
        self.text_parts: list[str] = []
        self.final: RequestOutput | None = None

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        record = self.record
        async for out in self.state.engine.generate(self.prep.prompt_ids, self.prep.params, self.prep.request_id):
            record.first_token()
            self.ids += out.new_token_ids
            self.text_parts.append(out.text_delta)
            if out.finished:
                self.final = out
                record.prompt_tokens = out.prompt_tokens
                record.completion_tokens = out.completion_tokens
                record.finish_reason = out.finish_reason
                record.engine_stats = out.stats
            yield out

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def spec_usage(self) -> dict[str, Any] | None:
        """The request's speculative counters for the usage object (`ninfer_spec`, a vendor field
        next to the standard ones), when the engine speculates (--spec) and the request is done."""
        if getattr(self.state.llm, "speculative", None) is None or self.final is None:
            return None
        s = (self.final.stats or {}).get("spec") or {}
        return {
            "drafted": s.get("drafted", 0),
            "accepted": s.get("accepted", 0),
            "rounds": s.get("rounds", 0),
            "accepted_per_position": list(s.get("accepted_per_position", [])),
        }

    def stop_string(self) -> str | None:
        """The stop string that ended the text, if one did (rather than a stop token or the budget)."""
        f = self.final
        stops = self.prep.params.stop
        if f is None or f.finish_reason != "stop" or not stops or not self.ids:
            return None
        if not self.prep.params.ignore_eos and self.ids[-1] in self.prep.params.stop_token_ids:
            return None
        # the engine cut the text right before the match: it starts where the returned text ends
        full = self.state.tokenizer.decode(self.ids, skip_special_tokens=True)
        rest = full[len(self.text) :]
        for s in stops:
            if rest.startswith(s):
                return s
        return stops[0] if len(stops) == 1 else None


# --- output channels ------------------------------------------------------------------------------


@dataclass
class Channels:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


class StreamChannels:
    """Text deltas -> (reasoning delta, content delta, completed tool calls)."""

    def __init__(self, prep: Prepared, make_id: Callable[[], str]) -> None:
        self.reasoning = ReasoningSplitter(thinking=prep.thinking)
        self.tools = ToolCallStream(prep.tools, emit_early=False, make_id=make_id) if prep.parse_tools else None
        self.any_calls = False

    def push(self, text: str, *, last: bool) -> Channels:
        r, c = self.reasoning.push(text) if text else ("", "")
        if last:
            r2, c2 = self.reasoning.finish()
            r, c = r + r2, c + c2
        out = Channels(r, c)
        if self.tools is not None:
            out.content, out.calls = self.tools.push(c) if c else ("", [])
            if last:
                c3, calls3 = self.tools.finish()
                out.content += c3
                out.calls += calls3
            self.any_calls = self.any_calls or bool(out.calls)
        return out


def final_channels(text: str, prep: Prepared, make_id: Callable[[], str]) -> Channels:
    reasoning, content = split_reasoning(text, thinking=prep.thinking)
    calls: list[ToolCall] = []
    if prep.parse_tools:
        content, calls = parse_tool_calls(content, prep.tools, make_id=make_id)
    return Channels(reasoning, content, calls)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)
