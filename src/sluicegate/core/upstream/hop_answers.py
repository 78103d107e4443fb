"""What an upstream's answer other than a stream means for the client: one table.

An upstream answers a streamed request with a status, or with a 200 whose
stream fails before any content (an in-band error event, maybe with a ``code``).
Neither passes to the client as it came: ``answer_of_status`` maps any status
(1xx to 5xx, and numbers outside them) to a ``HopAnswer``, the status the
client gets and whose fault it was, and ``status_of_code`` reads an in-band
error's ``code`` as a status only when it is one (vLLM sends its HTTP status
there). ``retry_after_s`` reads an overloaded upstream's ``Retry-After``,
clamped to ``MAX_RETRY_AFTER_S``.

The table (``STATUS_ANSWERS``, then ``answer_of_status``'s ranges):

======================  ==========  =================================
upstream                client      fault
======================  ==========  =================================
400, 422                400         ``CLIENT`` (the request)
413                     413         ``CLIENT``
429, 503                503         ``OVERLOADED`` (+ ``Retry-After``)
504                     504         ``TIMEOUT``
401, 403, 404, 405,     502         ``SETUP`` (the gateway's URL,
407, other 4xx                      model name or key)
408                     502         ``BROKEN``
other 5xx               502         ``BROKEN``
1xx, 2xx but 200        502         ``BROKEN``
3xx                     502         ``REDIRECT`` (never followed)
< 100 or > 599          502         ``BROKEN``
======================  ==========  =================================

Invariants:
    - Every answer's status is one of 400, 413, 502, 503, 504: an upstream's
      407, 408, 418 or 301 never reaches the client as it came.
    - No function here raises, whatever it is given.

Deliberate divergences: an upstream's 404 is not the client's 404: the
gateway chose the path and the model name the upstream did not find, so it is
the gateway's setup that is wrong (502). An upstream's 429 is the gateway's own
rate limit there, not the client's, so the client gets 503, as for any
overloaded engine; its own 429 comes from sluicegate's quotas.

Spec: RFC 9110, sections 15 (status codes) and 10.2.3 (``Retry-After``);
OpenAI API reference, "Error codes".
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "MAX_RETRY_AFTER_S",
    "STATUS_ANSWERS",
    "Fault",
    "HopAnswer",
    "answer_of_status",
    "retry_after_s",
    "status_of_code",
]

MAX_RETRY_AFTER_S: Final = 3600.0
"""The longest ``Retry-After`` passed on (seconds): an upstream's longer wait is
cut to it."""

DEFAULT_RETRY_AFTER_S: Final = 1.0
"""``Retry-After`` of an overloaded upstream that gave none, or one unreadable."""


class Fault(StrEnum):
    """Whose fault an upstream's answer was, and so what the gateway does."""

    CLIENT = "client"
    """The request: the client gets its 4xx; no other upstream is tried."""
    SETUP = "setup"
    """The gateway's setup for this upstream (its URL, model name, key): 502;
    no other upstream is tried, the upstream is not counted as failed."""
    OVERLOADED = "overloaded"
    """The upstream is busy: 503 with ``Retry-After``; another is tried."""
    TIMEOUT = "timeout"
    """The upstream (or one behind it) ran out of time: 504; another is tried."""
    BROKEN = "broken"
    """The upstream misbehaved: 502; another is tried, it counts as failed."""
    REDIRECT = "redirect"
    """The upstream redirected: never followed; 502, as ``BROKEN``."""

    @property
    def retry_elsewhere(self) -> bool:
        """Whether another upstream of the pool may take the request."""
        return self not in (Fault.CLIENT, Fault.SETUP)

    @property
    def failed(self) -> bool:
        """Whether the upstream counts as failed (towards its ejection)."""
        return self in (Fault.TIMEOUT, Fault.BROKEN, Fault.REDIRECT)


@dataclass(frozen=True, slots=True)
class HopAnswer:
    """What the client gets for one upstream answer.

    Attributes:
        status: the client's HTTP status (400, 413, 502, 503 or 504).
        fault: whose fault it was.
    """

    status: int
    fault: Fault


STATUS_ANSWERS: Final[Mapping[int, HopAnswer]] = MappingProxyType(
    {
        400: HopAnswer(400, Fault.CLIENT),
        413: HopAnswer(413, Fault.CLIENT),
        422: HopAnswer(400, Fault.CLIENT),
        408: HopAnswer(502, Fault.BROKEN),
        429: HopAnswer(503, Fault.OVERLOADED),
        503: HopAnswer(503, Fault.OVERLOADED),
        504: HopAnswer(504, Fault.TIMEOUT),
    }
)
"""The statuses with an answer of their own; ``answer_of_status`` gives the rest."""

_SETUP = HopAnswer(502, Fault.SETUP)
_BROKEN = HopAnswer(502, Fault.BROKEN)
_REDIRECT = HopAnswer(502, Fault.REDIRECT)


def answer_of_status(status: int) -> HopAnswer:
    """The client's answer when an upstream answers ``status`` instead of a
    stream (any integer; 200 included, for a 200 read as a failure).

    Spec: RFC 9110, section 15 (the classes of status codes).
    """
    answer = STATUS_ANSWERS.get(status)
    if answer is not None:
        return answer
    if 300 <= status <= 399:
        return _REDIRECT
    if 400 <= status <= 499:
        return _SETUP
    return _BROKEN


def status_of_code(code: object) -> int | None:
    """An in-band error's ``code`` as an HTTP status, or ``None``.

    A status is an ``int`` (not a ``bool``) from 100 to 599, or a string of
    exactly three ASCII digits naming one; anything else (a float, a huge
    number, Unicode digits such as ``"⁵⁰³"``, ``null``, an object, a word
    such as ``"rate_limited"``) is not a status.
    """
    if isinstance(code, str) and _STATUS.fullmatch(code):
        code = int(code)
    if type(code) is int and 100 <= code <= 599:
        return code
    return None


_STATUS = re.compile(r"[0-9]{3}")
_SECONDS = re.compile(r"[0-9]+")


def retry_after_s(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header's wait in seconds, from 0 to ``MAX_RETRY_AFTER_S``.

    Args:
        value: the header's value: delay-seconds (ASCII digits) or an HTTP
            date; ``None`` when absent.
        now: the Unix time (seconds) an HTTP date is counted from.

    Returns:
        The wait, clamped (a huge number or a far date is ``MAX_RETRY_AFTER_S``,
        a past date 0); ``None`` when absent or unreadable (a negative or
        fractional number, garbage, a date that is no date).

    Spec: RFC 9110, section 10.2.3.
    """
    if value is None:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        # More digits than an hour has are an hour, unread (int() of a long
        # digit string is quadratic, and refused past 4,300 digits).
        seconds = MAX_RETRY_AFTER_S if len(value) > 9 else float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
            if when.tzinfo is None:  # "-0000": UTC, says RFC 5322
                when = when.replace(tzinfo=UTC)
            seconds = when.timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)
