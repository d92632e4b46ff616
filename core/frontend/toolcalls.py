"""Tool calls in Qwen's XML-ish format, parsed from the content channel.

The template asks the model to answer a call as

    optional text
    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE (may span lines)
    </parameter>
    </function>
    </tool_call>

one block per call, blocks separated by whitespace, nothing after the last. Rules:
- text before the first `<tool_call>` is `content` (trailing whitespace dropped: the template puts
  "\\n\\n" between an answer and its first call);
- every block must parse and nothing but whitespace may follow the blocks, else the whole text is
  plain content and there are no calls;
- NAME is 1-64 of [A-Za-z0-9_-]; a name that is not among the request's tools is still returned
  (the client sees what the model asked for and can answer with an error; we never run tools);
- VALUE loses the one newline after `<parameter=ARG>` and the one before `</parameter>`; a
  `</parameter>` inside a value is fine as long as it is not followed by another parameter or by
  `</function>`; `</tool_call>` inside a value is not supported;
- arguments are typed by the tool's JSON schema with `json.loads` or `ast.literal_eval` only (never
  eval): integer, number, boolean, null, object, array; a value that does not fit its declared type,
  a parameter the schema does not declare, or an unknown tool keeps the text as a string;
- a parameter given twice makes the block malformed.
"""

from __future__ import annotations

import ast
import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ninfer.frontend.stops import held_suffix

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_INT = re.compile(r"[+-]?[0-9]+")
# after a </parameter>: another parameter or the end of the function body must follow
_PARAM_END = re.compile(r"\s*(?:<parameter=|\Z)")
# ast.literal_eval walks its input recursively; past this size a value stays a string
_LITERAL_MAX_CHARS = 100_000


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI's `function.arguments`

    @property
    def input(self) -> dict[str, Any]:
        """The arguments as an object (Anthropic's `tool_use.input`)."""
        return json.loads(self.arguments)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# --- schemas --------------------------------------------------------------------------------------


def tool_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """name -> the JSON schema of its parameters, for OpenAI-style, bare and Anthropic-style tools."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function", tool)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        schema = fn.get("parameters", fn.get("input_schema"))
        out[fn["name"]] = schema if isinstance(schema, dict) else {}
    return out


def _declared_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or ():
            types += [x for x in _declared_types(sub) if x not in types]
    if not types:
        values = schema.get("enum") or ([schema["const"]] if "const" in schema else [])
        for v in values:
            name = _json_type(v)
            if name not in types:
                types.append(name)
    return types


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    return "string"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def _literal(text: str) -> Any:
    """A JSON or Python literal ({'a': True}), as JSON types; ValueError when it is neither."""
    try:
        return _loads(text)
    except (ValueError, RecursionError):
        pass
    if len(text) > _LITERAL_MAX_CHARS:
        raise ValueError("too long for a literal")
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise ValueError(str(e)) from e
    return _as_json(value)


def _as_json(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return v
    if isinstance(v, (list, tuple)):
        return [_as_json(x) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {k: _as_json(x) for k, x in v.items()}
    raise ValueError(f"{type(v).__name__} is not a JSON value")


def _convert(text: str, kind: str) -> Any:
    s = text.strip()
    if kind == "null":
        if s in ("null", "None"):
            return None
    elif kind == "boolean":
        if s.lower() in ("true", "false"):
            return s.lower() == "true"
    elif kind == "integer":
        if _INT.fullmatch(s):
            return int(s)  # ValueError past Python's 4300-digit limit: caught by the caller
        v = _loads(s)
        if isinstance(v, float) and v.is_integer():
            return int(v)
    elif kind == "number":
        v = _loads(s)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return v
    elif kind in ("object", "array"):
        v = _literal(s)
        if isinstance(v, dict if kind == "object" else list):
            return v
    raise ValueError(f"not a {kind}")


_TRY_ORDER = ("null", "boolean", "integer", "number", "object", "array")


def typed_value(text: str, schema: Any) -> Any:
    """The parameter text as the type its schema declares; the text itself when nothing fits."""
    types = _declared_types(schema)
    for kind in _TRY_ORDER:
        if kind in types:
            try:
                return _convert(text, kind)
            except (ValueError, RecursionError):
                continue
    return text


# --- parsing --------------------------------------------------------------------------------------


class _Malformed(Exception):
    pass


def _parse_block(inner: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The text between <tool_call> and </tool_call>: (name, arguments)."""
    body = inner.strip()
    if not body.startswith("<function=") or not body.endswith("</function>"):
        raise _Malformed("expected <function=NAME>...</function>")
    head_end = body.find(">")
    name = body[len("<function=") : head_end].strip()
    if not _NAME.fullmatch(name):
        raise _Malformed(f"bad function name {name!r}")
    rest = body[head_end + 1 : len(body) - len("</function>")]
    props = schemas.get(name, {}).get("properties")
    props = props if isinstance(props, dict) else {}
    args: dict[str, Any] = {}
    pos = 0
    while True:
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        if pos == len(rest):
            break
        if not rest.startswith("<parameter=", pos):
            raise _Malformed("expected <parameter=NAME>")
        name_end = rest.find(">", pos)
        if name_end < 0:
            raise _Malformed("unterminated <parameter=")
        pname = rest[pos + len("<parameter=") : name_end].strip()
        if not pname or "<" in pname or "\n" in pname:
            raise _Malformed(f"bad parameter name {pname!r}")
        if pname in args:
            raise _Malformed(f"parameter {pname!r} given twice")
        start = name_end + 1
        # the value ends at the first </parameter> that is followed by another parameter or the end
        search = start
        while True:
            close = rest.find("</parameter>", search)
            if close < 0:
                raise _Malformed(f"parameter {pname!r} is not closed")
            if _PARAM_END.match(rest, close + len("</parameter>")):
                break
            search = close + 1
        value = rest[start:close]
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        args[pname] = typed_value(value, props[pname]) if pname in props else value
        pos = close + len("</parameter>")
    return name, args


def _parse_blocks(
    tail: str, schemas: dict[str, dict[str, Any]], make_id: Callable[[], str]
) -> list[ToolCall]:
    """All blocks of `tail` (starting at the first <tool_call>); _Malformed if any is not whole."""
    calls = []
    pos = 0
    while True:
        while pos < len(tail) and tail[pos].isspace():
            pos += 1
        if pos == len(tail):
            return calls
        if not tail.startswith(OPEN, pos):
            raise _Malformed("text after the tool calls")
        end = tail.find(CLOSE, pos + len(OPEN))
        if end < 0:
            raise _Malformed("unterminated <tool_call>")
        name, args = _parse_block(tail[pos + len(OPEN) : end], schemas)
        calls.append(ToolCall(make_id(), name, json.dumps(args, ensure_ascii=False)))
        pos = end + len(CLOSE)


def parse_tool_calls(
    text: str, tools: list[dict[str, Any]] | None = None, *, make_id: Callable[[], str] = new_call_id
) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole generation's content channel; see the module docstring."""
    start = text.find(OPEN)
    if start < 0:
        return text, []
    try:
        calls = _parse_blocks(text[start:], tool_schemas(tools), make_id)
    except _Malformed:
        return text, []
    return text[:start].rstrip(), calls


class ToolCallStream:
    """The streaming parser: push content deltas, get (content_delta, completed calls).

    Content before the first `<tool_call>` streams as it comes (holding back trailing whitespace
    and a partial tag). After it, nothing is shown until the blocks resolve:
    - `emit_early=True` (default): each call is returned as soon as its `</tool_call>` arrives. If
      a later block is malformed, the text from that block on is returned as content and the calls
      already returned stand: the one case where the stream differs from `parse_tool_calls`
      (which would turn everything into content).
    - `emit_early=False`: calls are returned by `finish()` only, and the concatenation of the stream
      always equals `parse_tool_calls` of the whole text.
    Work per push is proportional to the delta, not to the block so far: a call that writes a
    large file as an argument streams in linear time.
    """

    def __init__(
        self,
        tools: list[dict[str, Any]] | None = None,
        *,
        emit_early: bool = True,
        make_id: Callable[[], str] = new_call_id,
    ) -> None:
        self._schemas = tool_schemas(tools)
        self._early = emit_early
        self._make_id = make_id
        # content -> (between <-> block) | strict -> plain, once the calls turn out malformed
        self._mode = "content"
        self._held = ""  # content: trailing whitespace + partial tag; between: whitespace + partial tag
        self._gap = ""  # whitespace between the content and the first <tool_call>
        self._parts: list[str] = []  # block: the block so far; strict: everything from the first tag
        self._window = ""  # block: the last chars, so a </tool_call> split across pushes is found
        self._emitted = 0

    @property
    def calls_started(self) -> bool:
        """True once a `<tool_call>` has been seen (the content before it is complete)."""
        return self._mode != "content" and not (self._mode == "plain" and self._emitted == 0)

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        if self._mode == "plain":
            return text, []
        if self._mode == "strict":
            self._parts.append(text)
            return "", []
        if self._mode != "content":
            return self._feed(text, [])
        buf = self._held + text
        start = buf.find(OPEN)
        if start < 0:
            keep = held_suffix(buf, (OPEN,))
            emit = buf[: len(buf) - keep].rstrip()
            self._held = buf[len(emit) :]
            return emit, []
        content = buf[:start]
        emit = content.rstrip()
        self._gap = content[len(emit) :]
        self._held = ""
        if not self._early:
            self._mode = "strict"
            self._parts = [buf[start:]]
            return emit, []
        self._mode = "between"
        more, calls = self._feed(buf[start:], [])
        return emit + more, calls

    def _feed(self, text: str, calls: list[ToolCall]) -> tuple[str, list[ToolCall]]:
        while text:
            if self._mode == "between":
                lead = self._held + text
                rest = lead.lstrip()
                if rest.startswith(OPEN):
                    self._mode, self._held, self._parts, self._window = "block", "", [OPEN], ""
                    text = rest[len(OPEN) :]
                    continue
                if OPEN.startswith(rest):  # only whitespace so far, or the next tag still arriving
                    self._held = lead
                    break
                return self._give_up(lead, calls)
            probe = self._window + text
            j = probe.find(CLOSE)
            if j < 0:
                self._parts.append(text)
                self._window = probe[-(len(CLOSE) - 1) :]
                break
            cut = j + len(CLOSE) - len(self._window)  # > 0: the window alone holds no whole tag
            self._parts.append(text[:cut])
            block, text = "".join(self._parts), text[cut:]
            self._parts, self._window = [], ""
            try:
                name, args = _parse_block(block[len(OPEN) : -len(CLOSE)], self._schemas)
            except _Malformed:
                return self._give_up(block + text, calls)
            calls.append(ToolCall(self._make_id(), name, json.dumps(args, ensure_ascii=False)))
            self._mode = "between"
        self._emitted += len(calls)
        return "", calls

    def _give_up(self, raw: str, calls: list[ToolCall]) -> tuple[str, list[ToolCall]]:
        """The blocks are malformed from here on: `raw` (all text not yet settled) is content."""
        self._mode, self._held, self._parts = "plain", "", []
        self._emitted += len(calls)
        if self._emitted == 0:
            return self._gap + raw, []  # nothing was shown as a call: all of it is plain content
        return raw.lstrip(), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        mode, held, parts = self._mode, self._held, self._parts
        self._mode, self._held, self._parts = "plain", "", []
        if mode == "content":
            return held, []
        if mode == "strict":
            tail = "".join(parts)
            try:
                return "", _parse_blocks(tail, self._schemas, self._make_id)
            except _Malformed:
                return self._gap + tail, []
        if mode == "block":
            return self._give_up("".join(parts), [])  # a block that never closed
        if mode == "between" and held.strip():
            return self._give_up(held, [])
        return "", []
