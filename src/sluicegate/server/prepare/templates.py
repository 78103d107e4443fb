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
    - Control tokens come only from the template's own text: control-token text
      in a message's content is tokenized as text (``control_text.py``); the
      rest of the rendered text is tokenized as before, with special tokens
      parsed. BOS is added only when the text does not already start with
      ``bos_token``: never twice.
    - A prompt too long to leave room for a completion is refused before it is
      tokenized (``check_prompt_size``: a bound from the longest piece).
    - A failure while rendering is the client's (400), and the message names the
      message at which rendering starts to fail, found by bisection (log2(n)
      renders of prefixes). A template that does not compile is the server's:
      ``ChatTemplate`` raises at construction, at startup.

Tools: a template that reads ``tools`` (``renders_tools``) gets them, and the
history's tool calls and results, in the Hugging Face shape; any other template
(the built-in one included) gets plain messages in the block format of
docs/tools.md (``server/prepare/tools.py``).

Deliberate divergences: ``developer`` messages are rendered as ``system``
messages, since templates written before that role know only ``system``; message
content reaches the template as a string.

Spec: Hugging Face "Chat templates" (the template variables); Gemma 3 model card
(the built-in format).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from types import CodeType
from typing import Any, NoReturn

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sluicegate.core.decoding.reasoning_parsers import (
    ReasoningParser,
    detect_reasoning_parser,
    reasoning_parser,
)
from sluicegate.core.errors import RequestError, bounded_repr
from sluicegate.engines.base import Tokenizer
from sluicegate.server.prepare.control_text import ControlText
from sluicegate.server.prepare.prompt_text import PromptText, check_prompt_size
from sluicegate.server.prepare.tools import ToolSetup, template_messages, template_tools
from sluicegate.server.schemas.messages import ChatMessage

__all__ = ["GEMMA3_TEMPLATE", "ChatTemplate", "encode_prompt", "text_prompt"]

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


def _environment() -> ImmutableSandboxedEnvironment:
    return ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, autoescape=False
    )


@lru_cache(maxsize=16)
def _compiled(source: str) -> tuple[CodeType, bool]:
    """``source`` compiled, and whether it reads ``tools``: the same for every
    ``ChatTemplate`` (their environments' options are the same), so done once
    per process (about 7 ms of CPU for the built-in template, which every app
    created paid)."""
    env = _environment()
    reads_tools = "tools" in meta.find_undeclared_variables(env.parse(source))
    return env.compile(source), reads_tools


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


class ChatTemplate:
    """The served model's chat template, compiled once.

    Args:
        tokenizer: the served model's tokenizer; its ``chat_template`` (or
            ``GEMMA3_TEMPLATE`` when ``None``), ``bos_token`` and ``eos_token``.
        source: a template that replaces the model's (``--chat-template FILE``).
        reasoning: ``--reasoning-parser``: a name of ``REASONING_PARSERS``, or
            ``"auto"`` to detect the family from the template's source
            (``detect_reasoning_parser``).

    Attributes:
        reasoning: the model's reasoning markers, or ``None`` when it has no
            reasoning channel (``"none"``, or nothing detected).

    Raises:
        jinja2.TemplateSyntaxError: the template does not compile (a server
            configuration error, raised at startup).
        KeyError: an unknown ``reasoning`` name.
    """

    def __init__(
        self, tokenizer: Tokenizer, source: str | None = None, reasoning: str = "auto"
    ) -> None:
        env = _environment()
        env.globals["raise_exception"] = _raise_exception
        self.source = source or tokenizer.chat_template or GEMMA3_TEMPLATE
        parser: ReasoningParser | None = (
            detect_reasoning_parser(self.source)
            if reasoning == "auto"
            else reasoning_parser(reasoning)
        )
        self.reasoning = parser if parser is not None and parser.reasons else None
        code, renders_tools = _compiled(self.source)
        self.renders_tools = renders_tools
        """Whether the template reads ``tools`` (and so renders tool messages)."""
        self._template = env.template_class.from_code(
            env, code, env.make_globals(None), None
        )
        # Every render copies the template's globals into its context, twice; as
        # the ChainMap make_globals() makes (template over environment) that cost
        # about 5 us a request. The environment is this object's own and never
        # changes after this line, so a flat copy holds the same names and values.
        self._template.globals = dict(self._template.globals)
        self._tokenizer = tokenizer
        # Read once: a tokenizer may decode them from its vocabulary on each read.
        self._bos_token = tokenizer.bos_token
        self._eos_token = tokenizer.eos_token
        self._control = ControlText(tokenizer)

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: ToolSetup | None = None,
    ) -> str:
        """The prompt text for ``messages``, ending with the generation prompt
        unless ``add_generation_prompt`` is false; with the calls ``tools``
        allows shown to the model.

        Raises:
            RequestError: 400 when the template refuses the messages; the message
                names the message at which rendering starts to fail (``param`` is
                ``messages[i]``).
        """
        plain, origins = template_messages(messages, tools, native=self.renders_tools)
        return self._checked_render(plain, add_generation_prompt, tools, origins)

    def encode(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered prompt (see ``prompt``).

        Raises:
            RequestError: see ``render``.
        """
        return self.prompt(
            messages, add_generation_prompt=add_generation_prompt
        ).encode()

    def prompt(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        context_length: int | None = None,
        tools: ToolSetup | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> PromptText:
        """The rendered prompt, ready to tokenize: BOS once, and control tokens
        only where the template wrote them (message contents are tokenized as
        text, so ``<end_of_turn>`` typed into a message cannot end its turn).

        Args:
            messages: the conversation.
            add_generation_prompt: end with the template's generation prompt.
            context_length: the model's context window (tokens); when given, a
                prompt too long to leave room for a completion is refused here,
                before any tokenizing (``check_prompt_size``).
            tools: the calls the request allows (shown to the model), or ``None``.
            variables: more template variables (``chat_template_kwargs``, such
                as ``enable_thinking``); they never replace the ones above.

        Raises:
            RequestError: see ``render``; and 400 ``context_length_exceeded``
                (``param`` ``messages``) from ``check_prompt_size``.
        """
        plain, origins = template_messages(messages, tools, native=self.renders_tools)
        escaped = self._escaped(plain)
        text = self._checked_render(
            escaped or plain, add_generation_prompt, tools, origins, variables
        )
        add_special = not (self._bos_token and text.startswith(self._bos_token))
        if escaped is None:  # no content holds control-token text: one call
            prompt = PromptText(self._tokenizer, (text,), add_special)
        else:
            parts = tuple(self._control.split(text))
            prompt = PromptText(self._tokenizer, parts, add_special, self._control)
        if context_length is not None:
            check_prompt_size(
                self._tokenizer, prompt.parts, context_length, param="messages"
            )
        return prompt

    def _escaped(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """``messages`` with control-token text in contents (and earlier
        reasoning) escaped, or ``None`` when none holds any."""
        changed = False
        out = []
        for message in messages:
            fields = {}
            for name in ("content", "reasoning_content"):
                text = message.get(name)
                escaped = None if text is None else self._control.escape(text)
                if escaped is not None:
                    fields[name] = escaped
            changed = changed or bool(fields)
            out.append({**message, **fields} if fields else message)
        return out if changed else None

    def _checked_render(
        self,
        messages: list[dict[str, Any]],
        generation_prompt: bool,
        setup: ToolSetup | None,
        origins: list[int],
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        tools = template_tools(setup) if self.renders_tools else None
        extra = variables or {}
        try:
            return self._render(messages, generation_prompt, tools, extra)
        except jinja2.TemplateError as exc:
            failing = self._first_failing(messages, generation_prompt, tools, extra)
            index = origins[failing] if failing < len(origins) else failing
            raise RequestError(
                f"The chat template cannot render messages[{index}] "
                f"(role {messages[failing]['role']!r}): {bounded_repr(str(exc))}",
                param=f"messages[{index}]",
                code="invalid_messages",
            ) from exc

    def _render(
        self,
        messages: list[dict[str, Any]],
        generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        if tools is not None:  # left undefined otherwise, as templates expect
            return self._template.render(
                extra or {},
                messages=messages,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
                add_generation_prompt=generation_prompt,
                tools=tools,
            )
        return self._template.render(
            extra or {},
            messages=messages,
            bos_token=self._bos_token,
            eos_token=self._eos_token,
            add_generation_prompt=generation_prompt,
        )

    def _first_failing(
        self,
        messages: list[dict[str, Any]],
        generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
        extra: Mapping[str, Any],
    ) -> int:
        # The whole list fails. Bisect for where failing starts: messages[:good]
        # renders (the empty prefix is taken to), messages[:bad] does not, so
        # messages[bad - 1] is at fault. That is the first message that cannot be
        # rendered when a failing list stays failing as it grows, as templates
        # that check message by message do; log2(n) renders, not n.
        good, bad = 0, len(messages)
        while bad - good > 1:
            middle = (good + bad) // 2
            try:
                self._render(messages[:middle], generation_prompt, tools, extra)
            except jinja2.TemplateError:
                bad = middle
            else:
                good = middle
        return bad - 1


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` with special tokens parsed and BOS added once.

    BOS is prepended (``add_special``) only when ``text`` does not already start
    with ``tokenizer.bos_token``. An empty ``text`` gives just what the tokenizer
    adds (possibly nothing).
    """
    return text_prompt(tokenizer, text).encode()


def text_prompt(
    tokenizer: Tokenizer,
    text: str,
    *,
    context_length: int | None = None,
    param: str = "prompt",
) -> PromptText:
    """``text`` as a prompt to tokenize as ``encode_prompt`` does.

    Raises:
        RequestError: 400 ``context_length_exceeded`` naming ``param``, when
            ``context_length`` is given and ``text`` cannot leave room in it
            (``check_prompt_size``, before any tokenizing).
    """
    if context_length is not None:
        check_prompt_size(tokenizer, [text], context_length, param=param)
    bos = tokenizer.bos_token
    return PromptText(tokenizer, (text,), not (bos and text.startswith(bos)))
