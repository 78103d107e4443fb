"""Request bodies of the OpenAI chat and completions endpoints, validated.

``ChatCompletionRequest`` and ``CompletionRequest`` are frozen pydantic models;
``parse.py`` validates a decoded JSON object against them and raises
``RequestError`` (400) whose message names the parameter, the limit and the value
seen. Types are strict: a string is never read as a number, ``true`` never as
``1``.

Deliberate divergences from the OpenAI API reference:

- ``stop`` allows up to ``MAX_STOP_STRINGS`` (16) strings; OpenAI allows 4.
  Empty stop strings are refused (one would match before any text), and so are
  ones longer than ``MAX_STOP_CHARS`` (1,000) characters.
- Message ``content`` may be a string or a list of ``{"type": "text"}`` parts
  (joined with ``"\\n"``); images, audio and files are refused. A request has
  at most ``MAX_MESSAGES`` (2,048) messages.
- Completions ``logprobs`` allows up to ``MAX_TOP_LOGPROBS`` (20) alternatives;
  OpenAI allows 5. ``echo`` with ``logprobs`` is refused (prompt tokens carry no
  logprobs here).
- Parameters that would change the answer in ways not implemented yet
  (``functions``, ``suffix``, ``best_of``, ...) are refused with 400 when set to
  anything but their default, instead of being ignored.
- ``tools`` holds at most ``MAX_TOOLS`` (128) functions with distinct names of
  at most 64 characters from ``[A-Za-z0-9_-]``; ``tool_choice`` other than
  ``none`` needs ``tools``, and a named one must name one of them. Assistant
  messages may carry ``tool_calls`` (their ``content`` then may be ``null``),
  and ``tool`` messages need a ``tool_call_id``; ``null`` content reads as
  ``""``. ``response_format`` is checked for its shape only here (what a
  schema may hold is checked where it is compiled).
- Extensions that vLLM accepts are read with vLLM's names and meanings:
  ``top_k`` (0 or -1 disables), ``min_p``, ``repetition_penalty``,
  ``stop_token_ids``, ``ignore_eos``, ``include_stop_str_in_output``,
  ``skip_special_tokens``, ``add_generation_prompt`` (chat) and
  ``continuous_usage_stats`` (top level or in ``stream_options``; it implies
  ``include_usage``).
- ``stream_options.cadence_ms`` (0 to ``MAX_CADENCE_MS``) is this server's
  own: events on a fixed clock (see docs/side-channels.md).
  ``stream_options.include_obfuscation`` is OpenAI's; its default here is the
  server's setting (on unless ``serve --no-obfuscation``).
- ``chat_template_kwargs`` (vLLM's name) holds at most
  ``MAX_TEMPLATE_KWARGS`` variables for the chat template, each a name of at
  most 64 word characters and a boolean, a number or a string of at most
  ``MAX_TEMPLATE_KWARG_CHARS`` characters; they never replace the variables the
  server sets. Its ``enable_thinking`` and ``reasoning_effort`` (``"none"``
  switches thinking off, any other value on) choose whether the output begins
  inside the reasoning (docs/DESIGN.md, "Reasoning"). ``thinking_token_budget``
  (tokens, as newer vLLM names it) ends the reasoning at that many tokens.
- ``null`` for any parameter means "not given" (its default applies).
- Unknown parameters are ignored, and logged once per name (the first
  ``MAX_LOGGED_UNKNOWN`` names of the process, each cut to
  ``MAX_NAME_CHARS``); a request with more than ``MAX_UNKNOWN_PARAMETERS`` of
  them is refused.
- ``logit_bias`` keys are ASCII decimal token ids of at most
  ``MAX_TOKEN_ID_DIGITS`` digits (superscript two and the Arabic-Indic digits
  are digits to ``str.isdigit``, but not token ids).

Every value a refusal echoes goes through ``bounded_repr`` (a client's value may
be megabytes long, or nested deeper than ``repr`` recurses). The fields both
endpoints share are in ``fields.py``, a chat message in ``messages.py``;
a pydantic error becomes its 400 in ``param_errors.py``.

Spec: OpenAI API reference, "Create chat completion" and "Create completion".
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator
from typing_extensions import override

from sluicegate.core.errors import bounded_repr
from sluicegate.server.schemas.fields import (
    MAX_LOGIT_BIAS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOKEN_ID_DIGITS,
    RequestFields,
    StreamOptions,
)
from sluicegate.server.schemas.messages import ChatMessage
from sluicegate.server.schemas.param_errors import MAX_NAME_CHARS
from sluicegate.server.schemas.tools import (
    MAX_TOOLS,
    ResponseFormat,
    ToolChoice,
    ToolDefinition,
)

__all__ = [
    "MAX_LOGIT_BIAS",
    "MAX_MESSAGES",
    "MAX_NAME_CHARS",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "MAX_TOKEN_ID_DIGITS",
    "MAX_TOP_LOGPROBS",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "Prompt",
    "StreamOptions",
]

MAX_MESSAGES = 2048
"""Most messages of one chat request. OpenAI publishes no count; the chat template
renders on the event loop, and naming the message it refuses takes about
``1 + log2(messages)`` renders (``templates.py``): at 60,000 short messages (a
2.5 MB body) that stalled every stream 2.7 s on this project's 2-core machine,
at 2,048 it takes tens of milliseconds."""

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token: chat ``top_logprobs``, completions ``logprobs``."""

MAX_TEMPLATE_KWARGS = 16
"""Most variables ``chat_template_kwargs`` may hold."""

MAX_TEMPLATE_KWARG_CHARS = 1000
"""Longest string value of one ``chat_template_kwargs`` variable (chars)."""


class ChatCompletionRequest(RequestFields):
    """``POST /v1/chat/completions``.

    Spec: OpenAI API reference, "Create chat completion".
    """

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[ToolDefinition] = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    """``None``: ``auto`` with tools, ``none`` without (OpenAI's default)."""
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict, max_length=MAX_TEMPLATE_KWARGS
    )
    """More variables for the chat template (``enable_thinking``, ...)."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    """OpenAI's reasoning effort: ``"none"`` switches thinking off, any other
    value on (no budget is derived from it); also a template variable."""
    thinking_token_budget: int | None = Field(None, ge=1)
    """The most tokens a choice's reasoning may take (Messages ``budget_tokens``;
    docs/DESIGN.md, "Reasoning": where the end marker is forced or cut)."""

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(
        cls, value: dict[str, bool | int | float | str]
    ) -> dict[str, bool | int | float | str]:
        for name, item in value.items():
            if not (name.isidentifier() and name.isascii() and len(name) <= 64):
                raise ValueError(
                    f"expected variable names of at most 64 word characters; "
                    f"got {bounded_repr(name, 64)}"
                )
            if isinstance(item, str) and len(item) > MAX_TEMPLATE_KWARG_CHARS:
                raise ValueError(
                    f"expected strings of at most {MAX_TEMPLATE_KWARG_CHARS} "
                    f"characters; {name} has {len(item)}"
                )
        return value

    @property
    def thinking(self) -> bool | None:
        """Whether the request asks for thinking: ``chat_template_kwargs``
        ``enable_thinking`` (a boolean) first, then ``reasoning_effort``
        (``"none"``: no); ``None`` when it says nothing."""
        enabled = self.chat_template_kwargs.get("enable_thinking")
        if isinstance(enabled, bool):
            return enabled
        if self.reasoning_effort is None:
            return None
        return self.reasoning_effort != "none"

    @property
    def template_variables(self) -> dict[str, Any]:
        """The chat template's extra variables: ``chat_template_kwargs``, plus
        ``reasoning_effort`` and ``enable_thinking`` when the request set them
        and the kwargs did not."""
        variables: dict[str, Any] = {}
        if self.reasoning_effort is not None:
            variables["reasoning_effort"] = self.reasoning_effort
        if self.thinking is not None:
            variables["enable_thinking"] = self.thinking
        variables.update(self.chat_template_kwargs)
        return variables

    @property
    @override
    def top_logprobs_k(self) -> int | None:
        """``top_logprobs`` (0 when absent) if ``logprobs`` is true, else ``None``."""
        return (self.top_logprobs or 0) if self.logprobs else None


Prompt = str | list[int]
"""One completions prompt: text, or token ids."""


class CompletionRequest(RequestFields):
    """``POST /v1/completions``.

    Spec: OpenAI API reference, "Create completion".
    """

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        if value == "" or value == []:
            raise ValueError("the prompt is empty")
        if isinstance(value, str) or _is_ids(value):
            return value
        if not isinstance(value, list) or not all(
            isinstance(p, str) or _is_ids(p) for p in value
        ):
            raise ValueError(
                "expected a string, a list of token ids, a list of strings or a "
                "list of lists of token ids"
            )
        if len({type(p) for p in value}) > 1:
            raise ValueError("a batch mixes strings and token id lists")
        empty = next((i for i, p in enumerate(value) if not p), None)
        if empty is not None:
            raise ValueError(f"prompt[{empty}] is empty")
        return value

    @property
    def prompts(self) -> list[Prompt]:
        """The prompts of the batch, in order (one for a single prompt)."""
        prompt = self.prompt
        if isinstance(prompt, str) or _is_ids(prompt):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]

    @property
    @override
    def top_logprobs_k(self) -> int | None:
        """``logprobs`` (alternatives per token), or ``None``."""
        return self.logprobs


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(i) is int for i in value)
