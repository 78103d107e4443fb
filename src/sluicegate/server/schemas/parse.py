"""Request bodies -> validated request models: what the models cannot check alone.

``parse_chat_request`` and ``parse_completion_request`` refuse the parameters
not supported yet (unless left at their default), refuse too many unknown
parameters and log each new unknown name once, validate the body against its
model (``server/schemas/chat.py``: the models, and the divergences from the OpenAI API
reference they keep), and refuse parameters valid alone but not together.

Spec: OpenAI API reference, "Create chat completion" and "Create completion".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from sluicegate.core.errors import RequestError, bounded_repr
from sluicegate.server.schemas.chat import ChatCompletionRequest, CompletionRequest
from sluicegate.server.schemas.fields import RequestFields
from sluicegate.server.schemas.param_errors import (
    MAX_NAME_CHARS,
    check_tool_choice,
    short_name,
    validated,
)
from sluicegate.server.schemas.tools import check_tools

__all__ = [
    "MAX_LOGGED_UNKNOWN",
    "MAX_UNKNOWN_PARAMETERS",
    "parse_chat_request",
    "parse_completion_request",
]

logger = logging.getLogger(__name__)

MAX_UNKNOWN_PARAMETERS = 64
"""Most unknown top-level parameters one request may carry; more is a 400."""

MAX_LOGGED_UNKNOWN = 1024
"""Unknown parameter names logged (and remembered, so as to log each once) per
process; later new names are not logged."""

_logged_unknown: set[str] = set()
_field_names: dict[type[BaseModel], frozenset[str]] = {}  # asked once per model


def _not_set(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {}


# Each parameter that is not supported yet, with the test for "left at default".
_CHAT_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "functions": _not_set,
    "function_call": lambda v: v is None or v == "none",
    "audio": _not_set,
    "prediction": _not_set,
    "modalities": lambda v: v is None or v == ["text"],
}
_COMPLETION_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "suffix": lambda v: v is None or v == "",
    "best_of": lambda v: v is None or v == 1,
}
# Why each one is refused, appended to the 400's message.
_UNSUPPORTED_WHY = {
    "functions": "use tools, which replace it",
    "function_call": "use tool_choice, which replaces it",
    "suffix": "insertion (fill in the middle) is not built",
}


_Model = TypeVar("_Model", bound=RequestFields)


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
    check_tool_choice(body.get("tool_choice"))
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
                f"The parameter '{name}' is not supported yet "
                f"({_UNSUPPORTED_WHY.get(name, 'not built')}); "
                f"got {bounded_repr(body[name])}",
                param=name,
                code="unsupported_parameter",
            )
    _log_unknown(model, body, unsupported)
    request = validated(model, body)
    if request.stream_options is not None and not request.stream:
        raise RequestError(
            "stream_options is only allowed when stream is true",
            param="stream_options",
        )
    _check_combinations(request)
    return request


def _check_combinations(request: RequestFields) -> None:
    """Refuse parameters that are valid alone but not together."""
    if (
        isinstance(request, ChatCompletionRequest)
        and request.top_logprobs is not None
        and not request.logprobs
    ):
        raise RequestError(
            "top_logprobs is only allowed when logprobs is true; got "
            f"top_logprobs={request.top_logprobs!r} and logprobs=False",
            param="top_logprobs",
            code="invalid_value",
        )
    if isinstance(request, ChatCompletionRequest):
        check_tools(request.tools, request.tool_choice)
    echo = isinstance(request, CompletionRequest) and request.echo
    if echo and request.top_logprobs_k is not None:
        raise RequestError(
            "echo with logprobs is not supported yet (prompt tokens carry no "
            f"logprobs here); got echo=True and logprobs={request.top_logprobs_k!r}",
            param="echo",
            code="unsupported_parameter",
        )


def _log_unknown(
    model: type[BaseModel],
    body: Mapping[str, Any],
    known_unsupported: Mapping[str, object],
) -> None:
    """Refuse too many unknown parameters; log each new name once, cut short.

    The names logged are remembered (so that each is logged once) up to
    ``MAX_LOGGED_UNKNOWN`` per process, each cut to ``MAX_NAME_CHARS``: memory
    and log volume stay bounded whatever clients send.
    """
    known = _field_names.get(model)
    if known is None:
        known = _field_names[model] = frozenset(model.model_fields)
    unknown = body.keys() - known - known_unsupported.keys()
    if not unknown:
        return
    if len(unknown) > MAX_UNKNOWN_PARAMETERS:
        first = next(name for name in body if name in unknown)
        raise RequestError(
            f"The request has {len(unknown)} unknown parameters; at most "
            f"{MAX_UNKNOWN_PARAMETERS} are allowed (and ignored); the first is "
            f"{bounded_repr(first, MAX_NAME_CHARS)}",
            param=short_name(first),
            code="unknown_parameter",
        )
    for name in unknown:
        shown = bounded_repr(name, MAX_NAME_CHARS)
        if shown in _logged_unknown:
            continue
        if len(_logged_unknown) == MAX_LOGGED_UNKNOWN:
            # "" is no repr: it marks the set full, so this line is logged once.
            _logged_unknown.add("")
            logger.info(
                "ignoring unknown request parameters; the first %d names were "
                "logged, later ones are not",
                MAX_LOGGED_UNKNOWN,
            )
        if len(_logged_unknown) > MAX_LOGGED_UNKNOWN:
            return
        _logged_unknown.add(shown)
        logger.info("ignoring unknown request parameter %s", shown)
