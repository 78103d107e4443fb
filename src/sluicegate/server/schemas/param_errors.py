"""Refusals that name their parameter: pydantic's errors as 400s, client names cut.

``request_error`` turns pydantic's first error of a body into the
``RequestError`` (400) the client sees: the parameter as a path
(``messages[0].role``), the rule broken, and the value seen (through
``bounded_repr``). A parameter name a client chose (an unknown parameter, a
``logit_bias`` key) is cut to ``MAX_NAME_CHARS`` by ``short_name`` wherever it is
shown. The labels pydantic puts in a location for the member of a union it
tried (``literal['none','auto','required']``, ``function-after[...]``,
``NamedToolChoice``, ``str``) are not the client's and are left out.
``validated`` is the one place a body is checked against its model and
pydantic's error becomes that 400 (chat and completions, Responses, Messages).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sluicegate.core.errors import RequestError, bounded_repr

__all__ = [
    "MAX_NAME_CHARS",
    "check_tool_choice",
    "param_name",
    "reported_error",
    "request_error",
    "short_name",
    "validated",
]

M = TypeVar("M", bound=BaseModel)

MAX_NAME_CHARS = 64
"""Most characters of a client's parameter name that a log line or a ``param``
shows (and that ``parse.MAX_LOGGED_UNKNOWN`` keeps per name)."""


def validated(model: type[M], body: Mapping[str, Any]) -> M:
    """``body`` as a ``model``: its ``null`` values left out first (``null``
    means "not given", as the reference APIs read a body), the rest validated.

    Raises:
        RequestError: 400 for the error ``reported_error`` picks, naming its
            parameter (``request_error``).
    """
    try:
        return model.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        raise request_error(reported_error(exc.errors())) from exc


def request_error(error: ErrorDetails) -> RequestError:
    """The 400 for one pydantic error: a missing or an invalid parameter."""
    param = param_name(error["loc"])
    if error["type"] == "missing":
        return RequestError(f"Missing required parameter: '{param}'", param=param)
    message = error["msg"].removeprefix("Value error, ")
    seen = error.get("input")
    return RequestError(
        f"Invalid value for '{param}': {message}; got {bounded_repr(seen)}",
        param=param,
        code="invalid_value",
    )


def reported_error(errors: Sequence[ErrorDetails]) -> ErrorDetails:
    """The one of a body's pydantic errors (>= 1) a 400 reports: the first that
    is not a union member's type mismatch, else the first. A list given where
    ``str | list[TextBlock]`` is taken fails as a string too
    (``("system", "str")``, ``string_type``); the error inside the list
    (``("system", "list[TextBlock]", 0, "text")``, missing) says what is wrong."""
    for error in errors:
        last = error["loc"][-1] if error["loc"] else None
        mismatch = isinstance(last, str) and bool(_UNION_LABEL.fullmatch(last))
        if not (mismatch and error["type"].endswith("_type")):
            return error
    return errors[0]


# A union member's label: a schema with arguments (literal[...], list[str],
# function-after[...], tagged-union[...]), a bare type, or a model's class name.
_UNION_LABEL = re.compile(
    r"[a-z][a-z-]*\[.*\]|str|int|float|bool|list|dict|none|[A-Z][A-Za-z0-9]*",
    re.DOTALL,
)
# Parameters whose keys are the client's (never a union label).
_CLIENT_KEYED = frozenset({"logit_bias", "metadata", "chat_template_kwargs"})


def param_name(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "role")`` -> ``"messages[0].role"``; union labels
    left out: ``("tool_choice", "literal['none','auto','required']")`` ->
    ``"tool_choice"``."""
    name = ""
    after: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif after in _CLIENT_KEYED:  # a dict key (logit_bias) is the client's: cut it
            name += f".{short_name(part)}"
        elif part == "[key]":  # pydantic's mark of the key, not the value, failing
            pass
        elif not _UNION_LABEL.fullmatch(part):
            name += f".{part}" if name else part
        after = part
    return name


def check_tool_choice(choice: object) -> None:
    """Refuse a ``tool_choice`` object of a type other than ``function``
    (``allowed_tools``, hosted or custom tools): this server serves ``none``,
    ``auto``, ``required`` and a named function.

    Raises:
        RequestError: 400 with ``param`` ``tool_choice``.
    """
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(kind, str) and kind != "function":
        raise RequestError(
            f"tool_choice of type {bounded_repr(kind)} is not supported (this"
            " server takes 'none', 'auto', 'required' or a named function)",
            param="tool_choice",
            code="unsupported_value",
        )


def short_name(name: str) -> str:
    """``name``, or its first ``MAX_NAME_CHARS - 3`` characters and ``...``."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    return name[: MAX_NAME_CHARS - 3] + "..."
