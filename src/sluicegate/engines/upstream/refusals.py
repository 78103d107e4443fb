"""What an upstream's refusal or failure means for the client, and for the log.

Helpers of ``engines/upstream/engine.py``: the meaning of an upstream's answer other
than 200 (``refusal_of``), of an exchange with no valid answer
(``hop_failure``), of a 200 whose stream fails before any content
(``failure_before_content``) or after it (``failure_after_content``). Each
logs what happened, naming the upstream by ``UpstreamConfig.name``.

Invariants:
    - Statuses go through ``core/upstream/hop_answers.py``'s table, never as they came.
    - An upstream's text (its error body, its in-band message) reaches the
      client and the log only through its ``UpstreamConfig.redactor``; the
      client gets it only for a refusal that was the request's fault
      (``Fault.CLIENT``), or in the in-band error after content; every other
      client message is ours and names neither the upstream nor its words.
    - Only the ``Retry-After`` of an overloaded upstream passes to the client,
      read and clamped by ``retry_after_s``; no other header does.

Spec: OpenAI API reference, "Error codes"; RFC 9110, section 10.2.3
(``Retry-After``).
"""

from __future__ import annotations

import logging
import time

import orjson

from sluicegate.core.errors import (
    EngineError,
    EngineRefused,
    EngineUnavailable,
    UpstreamFailed,
    UpstreamProtocolError,
)
from sluicegate.core.upstream.hop_answers import (
    DEFAULT_RETRY_AFTER_S,
    Fault,
    answer_of_status,
    retry_after_s,
    status_of_code,
)
from sluicegate.core.upstream.items import PROTOCOL_ERROR_CODE
from sluicegate.engines.pool_values import Outcome
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.http import HopConnectError, HopError

__all__ = [
    "REFUSAL_BODY_MAX_BYTES",
    "failure_after_content",
    "failure_before_content",
    "hop_failure",
    "refusal_of",
]

logger = logging.getLogger("sluicegate.engines.upstream.engine")

REFUSAL_BODY_MAX_BYTES = 65536
"""Most bytes of a refused request's body that are read for its message."""


def refusal_of(
    status: int,
    body: bytes,
    retry_after: str | None,
    upstream: UpstreamConfig,
    now: float | None = None,
) -> tuple[EngineRefused, Outcome, bool]:
    """What an upstream's answer other than 200 before its stream means.

    The status goes through the table of ``core/upstream/hop_answers.py``; the body is
    never passed on as it came: the client gets the upstream's message only for
    its own fault (a 400, 413 or 422), redacted and cut, and otherwise a message
    of ours naming the status; the log gets the redacted body.

    Args:
        status: the upstream's status (any integer).
        body: the start of its body (``REFUSAL_BODY_MAX_BYTES`` at most).
        retry_after: its ``Retry-After`` header, or ``None``.
        upstream: the upstream (its redactor and name).
        now: the Unix time (seconds) for an HTTP-date ``Retry-After``.

    Returns:
        The refusal to give the client if no other upstream takes the request;
        the outcome for the upstream's health; whether to try another one.
    """
    answer = answer_of_status(status)
    message, kind, code, param = _error_fields(body)
    redactor = upstream.redactor
    text = body.decode("utf-8", "replace") if message is None else message
    _log(answer.fault, f"{upstream.name} answered {status}: {redactor.redact(text)}")
    if answer.fault is Fault.CLIENT:
        shown = redactor.redact(message or "") or f"the upstream refused it ({status})"
        refusal = EngineRefused(
            shown,
            answer.status,
            error_type=redactor.token(kind),
            code=redactor.token(code),
            param=redactor.token(param),
        )
    else:
        wait = None
        if answer.fault is Fault.OVERLOADED:
            now = time.time() if now is None else now
            wait = retry_after_s(retry_after, now)
            wait = DEFAULT_RETRY_AFTER_S if wait is None else wait
        refusal = EngineRefused(
            _MESSAGES[answer.fault].format(status=status),
            answer.status,
            retry_after_s=wait,
        )
    outcome = Outcome.FAILURE if answer.fault.failed else Outcome.REFUSED
    return refusal, outcome, answer.fault.retry_elsewhere


_MESSAGES = {
    Fault.SETUP: (
        "the upstream refused the gateway's request ({status}): the gateway's "
        "setup for it (URL, model name or key) is wrong"
    ),
    Fault.OVERLOADED: "the upstream is overloaded ({status}); retry later",
    Fault.TIMEOUT: "the upstream ran out of time ({status})",
    Fault.BROKEN: "the upstream failed ({status})",
    Fault.REDIRECT: (
        "the upstream answered with a redirect ({status}); redirects are not followed"
    ),
}
"""The client's message per fault (``CLIENT``'s is the upstream's own, redacted)."""


def failure_before_content(
    message: str, code: str | None, kind: str | None, upstream: UpstreamConfig
) -> tuple[EngineRefused, Outcome, bool]:
    """What an upstream's 200 means when its stream fails before any content.

    The stream broke, ended (with or without ``[DONE]``) or sent an in-band
    error before its first text, tool call or finish: nothing reached the
    client, so it is answered as the status the upstream would have given.

    Args:
        message: what went wrong (the upstream's in-band message, or ours).
        code: the in-band error's code as text; a status there (vLLM sends
            one) is read by ``status_of_code``: three ASCII digits only.
        kind: the in-band error's type, or ``None``.
        upstream: the upstream (its redactor and name).

    Returns:
        As ``refusal_of`` for an in-band error whose code is a status;
        otherwise a 502 to try on another upstream, counted as its failure.
    """
    status = status_of_code(code)
    if status is not None:
        body = orjson.dumps({"error": {"message": message, "type": kind, "code": code}})
        return refusal_of(status, body, None, upstream)
    redacted = upstream.redactor.redact(message)
    logger.warning("%s failed before any content: %s", upstream.name, redacted)
    text = "the upstream failed before any content"
    protocol = code == PROTOCOL_ERROR_CODE
    if protocol:  # the reader's own words (quoting the upstream, redacted)
        text = f"{text}: {redacted}"
    refusal = UpstreamFailed(
        text,
        error_type=upstream.redactor.token(kind),
        code=PROTOCOL_ERROR_CODE if protocol else None,
    )
    return refusal, Outcome.FAILURE, True


def hop_failure(
    error: HopError, upstream: UpstreamConfig
) -> tuple[EngineError, Outcome]:
    """What a failed exchange before any response means (``HopError``), and
    the upstream's outcome (a failure, either way).

    No connection (``HopConnectError``) is ``EngineUnavailable`` (503 with the
    server's ``Retry-After``); a connection whose answer was not HTTP (a
    malformed status line or header line, a reset before the head) is a
    ``Fault.BROKEN`` 502. Either way another upstream is tried first. The
    message is ours; the log gets the hop's (redacted by the hop).
    """
    logger.warning("%s", error)
    if isinstance(error, HopConnectError):
        return EngineUnavailable("the upstream could not be reached"), Outcome.FAILURE
    refusal = UpstreamFailed(
        _MESSAGES[Fault.BROKEN].format(status="no valid HTTP response")
    )
    return refusal, Outcome.FAILURE


def failure_after_content(
    message: str, code: str | None, upstream: UpstreamConfig
) -> EngineError:
    """The sequence's error when an upstream's stream fails after content:
    ``message`` (the upstream's, or ours quoting it) redacted, and logged; an
    ``UpstreamProtocolError`` when ``code`` is ``PROTOCOL_ERROR_CODE`` (the
    stream broke the protocol or a bound of the reader)."""
    redacted = upstream.redactor.redact(message)
    logger.warning("%s failed after content: %s", upstream.name, redacted)
    if code == PROTOCOL_ERROR_CODE:
        return UpstreamProtocolError(redacted)
    return EngineError(redacted)


def _log(fault: Fault, line: str) -> None:
    quiet = fault in (Fault.CLIENT, Fault.OVERLOADED)  # the request's, or load
    logger.log(logging.INFO if quiet else logging.WARNING, "%s", line)


def _error_fields(body: bytes) -> tuple[str | None, object, object, object]:
    """An error body's message, type, code and param (OpenAI, vLLM, TGI,
    FastAPI), as they came; ``None`` for a message that is not text."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None, None, None
    error = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(error, str):
        return error, None, None, None
    if not isinstance(error, dict):
        return None, None, None, None
    message = error.get("message", error.get("detail"))
    fields = (error.get(k) for k in ("type", "code", "param"))
    kind, code, param = fields
    return (message if isinstance(message, str) else None), kind, code, param
