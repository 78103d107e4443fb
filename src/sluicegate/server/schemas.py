"""Request bodies of the OpenAI chat and completions endpoints, validated.

``parse_chat_request`` and ``parse_completion_request`` take the decoded JSON
object and return a frozen pydantic model, or raise ``RequestError`` (400) whose
message names the parameter, the limit and the value seen. Types are strict: a
string is never read as a number, ``true`` never as ``1``.

Deliberate divergences from the OpenAI API reference:

- ``stop`` allows up to ``MAX_STOP_STRINGS`` (16) strings; OpenAI allows 4.
  Empty stop strings are refused (one would match before any text).
- Message ``content`` may be a string or a list of ``{"type": "text"}`` parts
  (joined with ``"\\n"``); images, audio and files are refused.
- A completions ``prompt`` is a string or one list of token ids; batches (a list
  of strings or of id lists) are refused until they are supported.
- Parameters that would change the answer in ways not implemented yet (``tools``,
  ``logprobs``, ``response_format``, ``echo``, ``suffix``, ...) are refused with
  400 when set to anything but their default, instead of being ignored.
- Unknown parameters are ignored, and logged once per name.

Spec: OpenAI API reference, "Create chat completion" and "Create completion".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from sluicegate.core.errors import RequestError

__all__ = [
    "MAX_STOP_STRINGS",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "StreamOptions",
    "parse_chat_request",
    "parse_completion_request",
]

logger = logging.getLogger(__name__)

MAX_STOP_STRINGS = 16
"""Most stop strings one request may give (OpenAI allows 4)."""

_logged_unknown: set[str] = set()


def _not_set(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {}


# Each parameter that is not supported yet, with the test for "left at default".
_CHAT_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "tools": _not_set,
    "tool_choice": lambda v: v is None or v == "none",
    "functions": _not_set,
    "function_call": lambda v: v is None or v == "none",
    "logprobs": _not_set,
    "top_logprobs": lambda v: v is None or v == 0,
    "logit_bias": _not_set,
    "response_format": lambda v: v is None or v == {"type": "text"},
    "audio": _not_set,
    "prediction": _not_set,
    "modalities": lambda v: v is None or v == ["text"],
}
_COMPLETION_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "echo": _not_set,
    "suffix": lambda v: v is None or v == "",
    "logprobs": lambda v: v is None or v == 0,
    "best_of": lambda v: v is None or v == 1,
    "logit_bias": _not_set,
}


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` is read."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    include_usage: bool = False
    """Send a last chunk with ``choices: []`` and the ``usage`` of the response."""


class ChatMessage(BaseModel):
    """One message; ``content`` is normalised to a string."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    role: Literal["system", "developer", "user", "assistant"]
    """Who wrote it; ``developer`` is OpenAI's newer name for ``system``."""
    content: str
    """The text (a list of text parts arrives joined with ``"\\n"``)."""

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else part
                raise ValueError(f"only text parts are supported; got {kind!r}")
            if not isinstance(part.get("text"), str):
                raise ValueError("a text part needs a string 'text'")
            texts.append(part["text"])
        return "\n".join(texts)


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    model: str | None = None
    n: int = Field(1, ge=1)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        if value is None:
            return []
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and "" in value:
            raise ValueError("stop strings must not be empty")
        return value

    @property
    def include_usage(self) -> bool:
        """Whether the stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``.

    Spec: OpenAI API reference, "Create chat completion".
    """

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens``, else the older ``max_tokens`` (tokens)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(_Common):
    """``POST /v1/completions``.

    Spec: OpenAI API reference, "Create completion".
    """

    prompt: str | list[int]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if value == "" or value == []:
            raise ValueError("the prompt is empty")
        if isinstance(value, str) or (
            isinstance(value, list) and all(type(i) is int for i in value)
        ):
            return value
        if isinstance(value, list) and all(isinstance(i, str | list) for i in value):
            raise ValueError(
                "a batch of prompts is not supported yet; send a string or one "
                "list of token ids per request"
            )
        raise ValueError("expected a string or a list of token ids")

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_tokens`` (tokens), or ``None`` when absent."""
        return self.max_tokens


_Model = TypeVar("_Model", bound=_Common)


def parse_chat_request(body: Mapping[str, Any]) -> ChatCompletionRequest:
    """Validate a chat completions body.

    Args:
        body: the decoded JSON object.

    Returns:
        The request; unknown fields dropped (each name logged once per process).

    Raises:
        RequestError: 400, naming the parameter (``param``, e.g.
            ``messages[0].role``), the limit and the value seen.

    Spec: OpenAI API reference, "Create chat completion".
    """
    return _parse(ChatCompletionRequest, body, _CHAT_UNSUPPORTED)


def parse_completion_request(body: Mapping[str, Any]) -> CompletionRequest:
    """Validate a (legacy) completions body; see ``parse_chat_request``.

    Spec: OpenAI API reference, "Create completion".
    """
    return _parse(CompletionRequest, body, _COMPLETION_UNSUPPORTED)


def _parse(
    model: type[_Model],
    body: Mapping[str, Any],
    unsupported: Mapping[str, Callable[[Any], bool]],
) -> _Model:
    for name, is_default in unsupported.items():
        if name in body and not is_default(body[name]):
            raise RequestError(
                f"The parameter '{name}' is not supported yet; got {body[name]!r}",
                param=name,
                code="unsupported_parameter",
            )
    _log_unknown(model, body, unsupported)
    try:
        request = model.model_validate(dict(body))
    except ValidationError as exc:
        raise _request_error(exc.errors()[0]) from exc
    if request.stream_options is not None and not request.stream:
        raise RequestError(
            "stream_options is only allowed when stream is true",
            param="stream_options",
        )
    return request


def _log_unknown(
    model: type[BaseModel],
    body: Mapping[str, Any],
    known_unsupported: Mapping[str, object],
) -> None:
    for name in body.keys() - model.model_fields.keys() - known_unsupported.keys():
        if name not in _logged_unknown:
            _logged_unknown.add(name)
            logger.info("ignoring unknown request parameter %r", name)


def _request_error(error: ErrorDetails) -> RequestError:
    param = _param_name(error["loc"])
    if error["type"] == "missing":
        return RequestError(f"Missing required parameter: '{param}'", param=param)
    message = error["msg"].removeprefix("Value error, ")
    seen = error.get("input")
    return RequestError(
        f"Invalid value for '{param}': {message}; got {seen!r}",
        param=param,
        code="invalid_value",
    )


def _param_name(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "role")`` -> ``"messages[0].role"``."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else part
    return name
