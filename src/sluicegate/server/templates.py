"""Chat messages -> prompt text -> token ids, through a sandboxed Jinja template.

``ChatTemplate`` compiles, once per server, the template the operator gave
(``--chat-template FILE``), else the model's own (``tokenizer.chat_template``),
else ``GEMMA3_TEMPLATE``. Rendering
runs in Jinja's ``ImmutableSandboxedEnvironment`` (templates come with model
files, so they are untrusted code) with ``trim_blocks`` and ``lstrip_blocks`` and
the variables chat templates expect: ``messages``, ``bos_token``, ``eos_token``,
``add_generation_prompt`` (true unless the request turns it off) and the
``raise_exception`` helper.

Invariants:
    - The rendered text is tokenized with special tokens parsed, and BOS is added
      only when the text does not already start with ``bos_token``: never twice.
    - A failure while rendering is the client's (400), and the message names the
      first message that cannot be rendered. A template that does not compile is
      the server's: ``ChatTemplate`` raises at construction, at startup.

Deliberate divergences: ``developer`` messages are rendered as ``system``
messages, since templates written before that role know only ``system``; message
content reaches the template as a string.

Spec: Hugging Face "Chat templates" (the template variables); Gemma 3 model card
(the built-in format).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sluicegate.core.errors import RequestError
from sluicegate.engines.base import Tokenizer
from sluicegate.server.schemas import ChatMessage

__all__ = ["GEMMA3_TEMPLATE", "ChatTemplate", "encode_prompt"]

GEMMA3_TEMPLATE = """\
{#- Gemma 3 turns. A leading system message joins the first user turn.
    Messages are dicts: m["role"] reads them directly, where m.role would first
    fail as an attribute in the sandbox. -#}
{{- bos_token -}}
{%- if messages and messages[0]["role"] == "system" -%}
  {%- set preamble = messages[0]["content"] ~ "\\n\\n" -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set preamble = "" -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
  {%- if message["role"] == "system" -%}
    {{- raise_exception("a system message is only allowed as the first message") -}}
  {%- endif -%}
  {%- set speaker = "model" if message["role"] == "assistant" else message["role"] -%}
  {%- set text = (preamble if loop.first else "") ~ message["content"] | trim -%}
  {{- "<start_of_turn>" ~ speaker ~ "\\n" ~ text ~ "<end_of_turn>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<start_of_turn>model\\n" -}}
{%- endif -%}
"""
"""The built-in chat format, used when the model ships no template (Gemma 3)."""


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


class ChatTemplate:
    """The served model's chat template, compiled once.

    Args:
        tokenizer: the served model's tokenizer; its ``chat_template`` (or
            ``GEMMA3_TEMPLATE`` when ``None``), ``bos_token`` and ``eos_token``.
        source: a template that replaces the model's (``--chat-template FILE``).

    Raises:
        jinja2.TemplateSyntaxError: the template does not compile (a server
            configuration error, raised at startup).
    """

    def __init__(self, tokenizer: Tokenizer, source: str | None = None) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, autoescape=False
        )
        env.globals["raise_exception"] = _raise_exception
        self.source = source or tokenizer.chat_template or GEMMA3_TEMPLATE
        self._template = env.from_string(self.source)
        # Every render copies the template's globals into its context, twice; as
        # the ChainMap from_string() makes (template over environment) that cost
        # about 5 us a request. The environment is this object's own and never
        # changes after this line, so a flat copy holds the same names and values.
        self._template.globals = dict(self._template.globals)
        self._tokenizer = tokenizer
        # Read once: a tokenizer may decode them from its vocabulary on each read.
        self._bos_token = tokenizer.bos_token
        self._eos_token = tokenizer.eos_token

    def render(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for ``messages``, ending with the generation prompt
        unless ``add_generation_prompt`` is false.

        Raises:
            RequestError: 400 when the template refuses the messages; the message
                names the first one that cannot be rendered (``param`` is
                ``messages[i]``).
        """
        plain = [_as_template_message(m) for m in messages]
        try:
            return self._render(plain, add_generation_prompt)
        except jinja2.TemplateError as exc:
            index = self._first_failing(plain, add_generation_prompt)
            raise RequestError(
                f"The chat template cannot render messages[{index}] "
                f"(role {plain[index]['role']!r}): {exc}",
                param=f"messages[{index}]",
                code="invalid_messages",
            ) from exc

    def encode(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered prompt (BOS once, special tokens parsed).

        Raises:
            RequestError: see ``render``.
        """
        text = self.render(messages, add_generation_prompt=add_generation_prompt)
        return _encode(self._tokenizer, text, self._bos_token)

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self._template.render(
            messages=messages,
            bos_token=self._bos_token,
            eos_token=self._eos_token,
            add_generation_prompt=generation_prompt,
        )

    def _first_failing(
        self, messages: list[dict[str, Any]], generation_prompt: bool
    ) -> int:
        # Render ever longer prefixes: the first one that fails ends with the
        # message at fault, whatever the template checks.
        for end in range(1, len(messages)):
            try:
                self._render(messages[:end], generation_prompt)
            except jinja2.TemplateError:
                return end - 1
        return len(messages) - 1


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` with special tokens parsed and BOS added once.

    BOS is prepended (``add_special``) only when ``text`` does not already start
    with ``tokenizer.bos_token``. An empty ``text`` gives just what the tokenizer
    adds (possibly nothing).
    """
    return _encode(tokenizer, text, tokenizer.bos_token)


def _encode(tokenizer: Tokenizer, text: str, bos: str) -> list[int]:
    add_special = not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_special=add_special, parse_special=True)


def _as_template_message(message: ChatMessage) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    return {"role": role, "content": message.content}
