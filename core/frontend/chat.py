"""The Qwen3.5/3.6 chat format: a native renderer and the checkpoint's own template.

`render_qwen36` is a plain-Python transcription of the published Qwen3.6 `chat_template.jinja`
(sha256 e84f32a2..., identical for 27B and 35B-A3B) and produces the same bytes; the tests check
this against the template itself, rendered in the sandbox, on many conversations. A checkpoint
whose template is exactly that file is rendered natively (21 messages and two tools: 80 us, against
730 us in the sandbox); any other template goes through the sandbox (`template.py`).

Both paths first run `normalize_conversation`, so they see the same input and refuse the same bad
input with the same `UserError`:
- roles system, developer, user, assistant, tool; `developer` is the OpenAI name for a system
  message and is rendered as one (the Qwen3.6 template knows only `system`);
- content: a string, None, or a list of text parts; image/video parts are refused for now;
- assistant `reasoning_content` (string) and `tool_calls` whose `arguments` may be a JSON string
  (OpenAI) or an object: strings are parsed, since the template iterates over them as a mapping;
- keys whose value is None are dropped (OpenAI sends `content: null` beside `tool_calls`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import structlog

from ninfer.errors import CheckpointError, UserError

log = structlog.get_logger("ninfer.frontend")

# sha256 of the published Qwen/Qwen3.6-27B (and 35B-A3B) chat_template.jinja, 7,764 bytes
QWEN36_TEMPLATE_SHA256 = "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259"

ROLES = ("system", "developer", "user", "assistant", "tool")

# The template's raise_exception messages, said so that the user knows what to change. Both
# renderers raise these exact sentences.
TEMPLATE_ERRORS = {
    "No messages provided.": "The conversation is empty: send at least one message.",
    "No user query found in messages.": (
        "The conversation has no user message (tool results do not count): add a user message."
    ),
    "System message must be at the beginning.": (
        "A system or developer message may only be the first message: merge it into the first one or move it there."
    ),
    "Unexpected message role.": "A message has an unknown role: use system, developer, user, assistant or tool.",
    "Unexpected content type.": "A message's content must be a string, null or a list of content parts.",
    "Unexpected item type in content.": "A content part must be an object with a string `text`.",
    "System message cannot contain images.": "Image and video content parts are not supported yet: send text parts only.",
    "System message cannot contain videos.": "Image and video content parts are not supported yet: send text parts only.",
}

# OpenAI chat sends "text"; its Responses API "input_text"/"output_text"; the template reads `text`
_TEXT_PARTS = (None, "text", "input_text", "output_text")
_MEDIA_KEYS = ("image", "image_url", "video", "video_url", "input_image", "input_audio", "audio")


# --- input checks ---------------------------------------------------------------------------------


def _plain(value: Any, where: str) -> Any:
    """A deep copy made of JSON types only: nothing else may reach a template."""
    if value is None or type(value) in (str, bool, int, float):
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UserError(f"{where}: object keys must be strings, got {k!r}.", param=where)
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):
        return str(value)
    raise UserError(f"{where}: a {type(value).__name__} is not a JSON value.", param=where)


def _check_content(content: Any, where: str) -> Any:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise UserError(
            f"{where}: content must be a string, null or a list of text parts, not {type(content).__name__}.",
            param=where,
        )
    for j, part in enumerate(content):
        pw = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise UserError(f"{pw}: a content part must be an object like {{\"type\": \"text\", \"text\": ...}}.", param=pw)
        kind = part.get("type")
        if kind in _MEDIA_KEYS or any(k in part for k in _MEDIA_KEYS):
            raise UserError(f"{pw}: image, video and audio parts are not supported yet: send text parts only.", param=pw)
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise UserError(f"{pw}: only text parts are supported: {{\"type\": \"text\", \"text\": \"...\"}}.", param=pw)
    return content


def _check_tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise UserError(f"{where}: a tool call must be an object with a function name and arguments.", param=where)
    call = {k: v for k, v in call.items() if v is not None}
    fn = call.get("function", call)
    fw = f"{where}.function" if "function" in call else where
    if not isinstance(fn, dict):
        raise UserError(f"{fw}: must be an object with `name` and `arguments`.", param=fw)
    fn = {k: v for k, v in fn.items() if v is not None}
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise UserError(f"{fw}.name: a tool call needs its function name as a non-empty string.", param=f"{fw}.name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise UserError(f"{fw}.arguments: not valid JSON ({e.args[0]}); send a JSON object.", param=f"{fw}.arguments") from e
    if args is not None and not isinstance(args, dict):
        raise UserError(f"{fw}.arguments: must be a JSON object, not {type(args).__name__}.", param=f"{fw}.arguments")
    if args is not None:
        fn["arguments"] = args
    if "function" in call:
        call["function"] = fn
        return call
    return fn


def normalize_conversation(
    messages: Any, tools: Any = None, *, keep_developer: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Check a conversation and return plain copies both renderers take. Raises UserError."""
    if not isinstance(messages, (list, tuple)):
        raise UserError("`messages` must be a list of message objects.", param="messages")
    if not messages:
        raise UserError(TEMPLATE_ERRORS["No messages provided."], param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        w = f"messages[{i}]"
        if not isinstance(m, dict):
            raise UserError(f"{w}: a message must be an object with `role` and `content`.", param=w)
        m = {k: v for k, v in m.items() if v is not None}
        role = m.get("role")
        if role not in ROLES:
            shown = repr(role) if isinstance(role, str) else "missing" if role is None else type(role).__name__
            raise UserError(
                f"{w}.role is {shown}: use system, developer, user, assistant or tool.",
                param=f"{w}.role",
                code="unsupported_role",
            )
        if role == "developer" and not keep_developer:
            m["role"] = "system"
        if "content" in m:
            _check_content(m["content"], f"{w}.content")
        if role == "assistant":
            if "reasoning_content" in m and not isinstance(m["reasoning_content"], str):
                raise UserError(f"{w}.reasoning_content must be a string.", param=f"{w}.reasoning_content")
            if "tool_calls" in m:
                calls = m["tool_calls"]
                if not isinstance(calls, list):
                    raise UserError(f"{w}.tool_calls must be a list.", param=f"{w}.tool_calls")
                m["tool_calls"] = [_check_tool_call(c, f"{w}.tool_calls[{j}]") for j, c in enumerate(calls)]
        if role == "tool" and "tool_call_id" in m and not isinstance(m["tool_call_id"], str):
            raise UserError(f"{w}.tool_call_id must be a string.", param=f"{w}.tool_call_id")
        out.append(_plain(m, w))
    return out, normalize_tools(tools)


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Function tools, each {"type": "function", "function": {"name", ...}} or a bare {"name", ...}."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise UserError("`tools` must be a list of function tools.", param="tools")
    for i, t in enumerate(tools):
        w = f"tools[{i}]"
        if not isinstance(t, dict):
            raise UserError(f"{w}: a tool must be an object like {{\"type\": \"function\", \"function\": {{...}}}}.", param=w)
        if "function" in t and t.get("type", "function") != "function":
            raise UserError(f"{w}.type: only function tools are supported.", param=f"{w}.type", code="tool_type_not_supported")
        fn = t.get("function", t)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise UserError(f"{w}: a function tool needs a non-empty string `name`.", param=w)
    return _plain(list(tools), "tools")


# --- the native renderer --------------------------------------------------------------------------

_TOOLS_HEAD = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
_TOOLS_TAIL = (
    "\n</tools>"
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and "
    "do not tell the user about function calls\n"
    "</IMPORTANT>"
)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_qwen36(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    enable_thinking: bool = True,
    preserve_thinking: bool | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The published Qwen3.6 template in Python. Takes `normalize_conversation` output."""
    out: list[str] = []
    first_is_system = messages[0]["role"] == "system"
    if tools:
        out.append("<|im_start|>system\n" + _TOOLS_HEAD)
        out.extend("\n" + _json(tool) for tool in tools)
        out.append(_TOOLS_TAIL)
        if first_is_system:
            system = _text(messages[0].get("content")).strip()
            if system:
                out.append("\n\n" + system)
        out.append("<|im_end|>\n")
    elif first_is_system:
        out.append("<|im_start|>system\n" + _text(messages[0].get("content")).strip() + "<|im_end|>\n")

    # Reasoning is kept for assistant turns after the last real user query; a user message that is
    # only a wrapped tool response does not count as a query.
    last_query = -1
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            c = _text(messages[i].get("content")).strip()
            if not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
                last_query = i
                break
    if last_query < 0:
        raise UserError(TEMPLATE_ERRORS["No user query found in messages."], param="messages")

    n = len(messages)
    for i, m in enumerate(messages):
        role = m["role"]
        content = _text(m.get("content")).strip()
        if role == "system":
            if i != 0:
                raise UserError(TEMPLATE_ERRORS["System message must be at the beginning."], param=f"messages[{i}]")
        elif role == "user":
            out.append("<|im_start|>user\n" + content + "<|im_end|>\n")
        elif role == "assistant":
            reasoning = m.get("reasoning_content")
            if not isinstance(reasoning, str):
                reasoning = ""
                if "</think>" in content:
                    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                    content = content.split("</think>")[-1].lstrip("\n")
            reasoning = reasoning.strip()
            if preserve_thinking is True or i > last_query:
                out.append("<|im_start|>assistant\n<think>\n" + reasoning + "\n</think>\n\n" + content)
            else:
                out.append("<|im_start|>assistant\n" + content)
            for j, call in enumerate(m.get("tool_calls") or ()):
                fn = call["function"] if "function" in call else call
                if j == 0:
                    out.append(("\n\n" if content.strip() else "") + "<tool_call>\n<function=" + fn["name"] + ">\n")
                else:
                    out.append("\n<tool_call>\n<function=" + fn["name"] + ">\n")
                for name, value in (fn.get("arguments") or {}).items():
                    shown = value if isinstance(value, str) else _json(value)
                    out.append("<parameter=" + name + ">\n" + shown + "\n</parameter>\n")
                out.append("</function>\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i > 0 and messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
        else:  # normalize_conversation lets no other role through
            raise UserError(TEMPLATE_ERRORS["Unexpected message role."], param=f"messages[{i}].role")

    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        out.append("<think>\n\n</think>\n\n" if enable_thinking is False else "<think>\n")
    return "".join(out)


# --- the chosen format ----------------------------------------------------------------------------


def template_sha256(source: str) -> str:
    """Identity of a template: one trailing newline is dropped (trim_blocks makes it render to nothing)."""
    if source.endswith("\n"):
        source = source[:-1]
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


class ChatFormat:
    """How prompts of one checkpoint are rendered: natively, or with its own template in the sandbox."""

    def __init__(
        self, template: str | None = None, *, origin: str = "built-in Qwen3.6 format", prefer_native: bool = True
    ) -> None:
        """`template` is jinja source (None: the built-in format). The published Qwen3.6 template is
        recognised by its sha256 and rendered natively unless `prefer_native=False`."""
        self.origin = origin
        if prefer_native and template is not None and template_sha256(template) == QWEN36_TEMPLATE_SHA256:
            template = None  # the published file: same bytes out, natively
        self.template = template
        if template is not None:
            from ninfer.frontend.template import compile_template

            compile_template(template)  # a broken template fails at load, not on the first request
            # A template that never mentions `developer` (Qwen3.6's) gets it as a system message; one
            # that does (Qwen3.8's) sees the role as sent.
            self._keep_developer = "developer" in template
        else:
            self._keep_developer = False

    @property
    def is_native(self) -> bool:
        return self.template is None

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Path | str | None) -> ChatFormat:
        """chat_template.jinja, else tokenizer_config.json's `chat_template`, else the built-in format."""
        if checkpoint_dir is None:
            return cls()
        d = Path(checkpoint_dir)
        path = d / "chat_template.jinja"
        if path.is_file():
            return cls.from_file(path)
        cfg = d / "tokenizer_config.json"
        if cfg.is_file():
            try:
                data = json.loads(cfg.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{cfg}: not readable JSON ({e}); restore the file or delete it.") from e
            template = _template_from_config(data.get("chat_template") if isinstance(data, dict) else None)
            if template is not None:
                return cls._logged(template, f"chat_template in {cfg}")
        return cls()

    @classmethod
    def from_file(cls, path: Path | str) -> ChatFormat:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: cannot read the chat template ({e}).") from e
        return cls._logged(text, str(path))

    @classmethod
    def _logged(cls, template: str, origin: str) -> ChatFormat:
        fmt = cls(template, origin=origin)
        if fmt.is_native:
            log.info("chat template is the published Qwen3.6 one: rendering natively", template=origin)
        else:
            log.info("chat template differs from the published Qwen3.6 one: rendering it in the jinja sandbox", template=origin)
        return fmt

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool = True,
        preserve_thinking: bool | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for `messages`. Raises UserError for a conversation the format refuses.

        `preserve_thinking=None` leaves the template's default (Qwen3.6: drop reasoning before the
        last user turn). `template_kwargs` (e.g. `reasoning_effort`) reach a sandboxed template only;
        the Qwen3.6 format reads nothing else.
        """
        for name, flag in (("enable_thinking", enable_thinking), ("add_generation_prompt", add_generation_prompt)):
            if not isinstance(flag, bool):
                raise UserError(f"`{name}` must be true or false.", param=name)
        if preserve_thinking is not None and not isinstance(preserve_thinking, bool):
            raise UserError("`preserve_thinking` must be true or false.", param="preserve_thinking")
        msgs, tool_list = normalize_conversation(messages, tools, keep_developer=self._keep_developer)
        if self.template is None:
            return render_qwen36(
                msgs,
                tool_list,
                enable_thinking=enable_thinking,
                preserve_thinking=preserve_thinking,
                add_generation_prompt=add_generation_prompt,
            )
        from ninfer.frontend.template import render_template

        context = {"tools": tool_list, **_plain(template_kwargs, "chat_template_kwargs")}
        context.update(messages=msgs, enable_thinking=enable_thinking, add_generation_prompt=add_generation_prompt)
        if preserve_thinking is not None:
            context["preserve_thinking"] = preserve_thinking
        return render_template(self.template, context, explain=TEMPLATE_ERRORS)

    def __repr__(self) -> str:
        return f"ChatFormat({'native' if self.is_native else 'sandboxed'}: {self.origin})"


def _template_from_config(value: Any) -> str | None:
    """tokenizer_config.json holds one template, or a list of named ones where `default` is the chat one."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


def render_chat(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool = True,
    preserve_thinking: bool | None = None,
    add_generation_prompt: bool = True,
    template: str | None = None,
    **template_kwargs: Any,
) -> str:
    """Render a conversation with the built-in Qwen3.6 format, or with `template` (jinja source)."""
    fmt = _NATIVE if template is None else ChatFormat(template, origin="template given by the caller")
    return fmt.render(
        messages,
        tools=tools,
        enable_thinking=enable_thinking,
        preserve_thinking=preserve_thinking,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )


_NATIVE = ChatFormat()
