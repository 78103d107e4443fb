"""Refusals that name their parameter: pydantic's errors as 400s, client names cut.

``request_error`` turns pydantic's first error of a body into the
``RequestError`` (400) the client sees: the parameter as a path
(``messages[0].role``), the rule broken, and the value seen (through
``bounded_repr``). A parameter name a client chose (an unknown parameter, a
``logit_bias`` key) is cut to ``MAX_NAME_CHARS`` by ``short_name`` wherever it is
shown.
"""

from __future__ import annotations

from pydantic_core import ErrorDetails

from sluicegate.core.errors import RequestError, bounded_repr

__all__ = ["MAX_NAME_CHARS", "param_name", "request_error", "short_name"]

MAX_NAME_CHARS = 64
"""Most characters of a client's parameter name that a log line or a ``param``
shows (and that ``parse.MAX_LOGGED_UNKNOWN`` keeps per name)."""


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


def param_name(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "role")`` -> ``"messages[0].role"``."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        else:  # a dict key (logit_bias) is the client's: cut it
            part = short_name(part)
            name += f".{part}" if name else part
    return name


def short_name(name: str) -> str:
    """``name``, or its first ``MAX_NAME_CHARS - 3`` characters and ``...``."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    return name[: MAX_NAME_CHARS - 3] + "..."
