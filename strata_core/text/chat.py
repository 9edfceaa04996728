"""Chat templates, rendered the way Hugging Face transformers' ``apply_chat_template`` does.

Same sandbox as the reference renderers (jinja2's ``SandboxedEnvironment``: no attribute
escapes, but the list and dict methods templates call, ``append``, ``update``, ..., work, on
copies of the caller's data; with ``trim_blocks``, ``lstrip_blocks``, loop controls and
``do``), same helpers (``raise_exception``, ``strftime_now``, a ``tojson`` that keeps
non-ASCII text, a pass-through ``{% generation %}`` tag) and the same render variables, so a
model's template produces here the prompt it was trained on. Every failure, from a syntax
error to a sandbox violation, surfaces as :class:`TemplateError`.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import SandboxedEnvironment

from strata_core.text.tool_setup import ToolSetup, setup_or_why

# Used when a GGUF carries no ``tokenizer.chat_template``: ChatML, the template transformers
# used as its class-level default, and the format most small instruct models are tuned on.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """A chat template is missing, does not parse, or failed while rendering."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant spans for training masks;
    transformers accepts it, so templates carry it; rendering just emits the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson escapes HTML characters and non-ASCII; chat templates want plain JSON.
    # A filter chain (``tools | map(attribute='function')``) hands over a generator: a list.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
        default=_json_default,
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@functools.lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template once; a syntax error raises :class:`TemplateError`."""
    env = SandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols, jinja2.ext.do],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from e


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""

    def __post_init__(self) -> None:
        if not self.source:
            raise TemplateError(
                "no chat template: the model carries no tokenizer.chat_template "
                "(pass a template, or use strata_core.chat.FALLBACK_TEMPLATE for ChatML)"
            )

    @functools.cached_property
    def _tool_probe(self) -> ToolSetup | str | None:
        return setup_or_why(self)

    @property
    def tool_setup(self) -> ToolSetup | None:
        """How this template's model calls tools and what history the template reads
        (tool_setup.py); None when it shows no tools or writes calls in no derivable way."""
        got = self._tool_probe
        return got if isinstance(got, ToolSetup) else None

    @property
    def tool_problem(self) -> str:
        """Why a template that shows tools gets the generic format (no format could be
        derived from its rendering of a call); "" where it does not."""
        got = self._tool_probe
        return got if isinstance(got, str) else ""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render ``messages`` to prompt text; extra kwargs (``enable_thinking`` ...) reach the
        template as variables and, as in transformers, override ``bos_token``/``eos_token``."""
        template = compile_template(self.source)
        # transformers always defines tools and documents (None when absent), and templates
        # test `tools is not none`, which an undefined variable would pass.
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        variables.setdefault("documents", None)
        try:
            # deep copies: a template may append to or update what it is given
            return template.render(
                messages=copy.deepcopy(list(messages)),
                add_generation_prompt=add_generation_prompt,
                tools=None if tools is None else copy.deepcopy(list(tools)),
                **copy.deepcopy(variables),
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e.message}") from e
        except Exception as e:  # a Python error inside an expression, e.g. None + 'text'
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
