"""Rendering a checkpoint's own chat template in jinja2's sandbox.

A chat template is code from the checkpoint's author, so it runs in `ImmutableSandboxedEnvironment`
(no attribute starting with `_`, no mutation of the data we pass, no unsafe `str.format`). The
environment matches the one Hugging Face's `apply_chat_template` builds, because that is what
templates are written against: `trim_blocks` and `lstrip_blocks` on, a `tojson` filter that is plain
`json.dumps(ensure_ascii=False)` (jinja's own escapes <, >, & and sorts keys, which would change the
prompt), `raise_exception`, `strftime_now`, loop controls, and `{% generation %}` accepted as a no-op.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.errors import CheckpointError, UserError


class TemplateRaised(jinja2.TemplateError):
    """`raise_exception(...)` called by the template: the conversation is not one it accepts."""


def _raise_exception(message: object) -> None:
    raise TemplateRaised(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` whose attribute names cannot start with `_` (no reaching CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - same trick as jinja's Namespace
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set the attribute {name!r}")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant tokens for training masks; render the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Parse a chat template once; a template that does not parse is a broken checkpoint."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise CheckpointError(
            f"The chat template does not parse (line {e.lineno}: {e.message}); fix the file or pass --raw."
        ) from e


def render_template(source: str, context: dict[str, Any], *, explain: dict[str, str] | None = None) -> str:
    """Render `source` with `context` in the sandbox; whatever goes wrong is the request's fault.

    `explain` turns the template's own `raise_exception` messages into clearer sentences.
    """
    template = compile_template(source)
    try:
        return template.render(**context)
    except TemplateRaised as e:
        msg = str(e)
        raise UserError((explain or {}).get(msg) or f"The chat template rejected the conversation: {msg}") from e
    except jinja2.exceptions.SecurityError as e:
        raise UserError(f"The chat template tried an operation the sandbox forbids ({e}); use another template.") from e
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError) as e:
        raise UserError(
            f"The chat template cannot render this conversation ({type(e).__name__}: {e}); "
            "check the message fields it reads."
        ) from e
    except RecursionError as e:
        raise UserError("The chat template recursed too deeply on this conversation; simplify the request.") from e
