"""``status_of``: the one map from an error to the HTTP status that answers it."""

from __future__ import annotations

import pytest

from sluicegate.core.errors import (
    BodyTooLarge,
    EngineError,
    EngineRefused,
    EngineTimeout,
    EngineUnavailable,
    ModelNotFound,
    RequestError,
    SluicegateError,
    StreamClosed,
    UnsupportedMediaType,
)
from sluicegate.core.events import Fail
from sluicegate.server.admission.access import HostNotAllowed
from sluicegate.server.admission.keys import (
    AdmissionError,
    Forbidden,
    OverQuota,
    Unauthenticated,
    Unavailable,
)
from sluicegate.server.streaming.shared import (
    FIRST_TOKEN_TIMEOUT,
    REQUEST_TIMEOUT,
    SERVER_SHUTDOWN,
)
from sluicegate.server.streaming.statuses import status_of


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (RequestError("bad"), 400),
        (ModelNotFound("x", ["m"]), 404),
        (BodyTooLarge(1, 2), 413),
        (UnsupportedMediaType(None), 415),
        (AdmissionError("no", "code"), 400),
        (Unauthenticated("no", "missing_api_key"), 401),
        (Forbidden("no", "model_not_allowed"), 403),
        (HostNotAllowed("no", "host_not_allowed"), 421),
        (OverQuota("slow down", "rate_limited", 3), 429),
        (Unavailable("busy", "queue_full", 1), 503),
        (EngineError("broke"), 500),
        (EngineUnavailable("busy"), 503),
        (EngineTimeout("late"), 500),  # no entry of its own: EngineError's
    ],
)
def test_each_error_class_has_its_status(error: SluicegateError, status: int) -> None:
    assert status_of(error) == status


@pytest.mark.parametrize("status", [400, 429, 503])
def test_an_engine_refusal_is_answered_with_its_own_status(status: int) -> None:
    assert status_of(EngineRefused("upstream said no", status)) == status


def test_a_subclass_without_an_entry_takes_its_nearest_base_status() -> None:
    class Teapot(ModelNotFound):
        pass

    assert status_of(Teapot("x", [])) == 404


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (EngineUnavailable.code, 503),
        (SERVER_SHUTDOWN, 503),
        (FIRST_TOKEN_TIMEOUT, 504),
        (REQUEST_TIMEOUT, 504),
        ("engine_error", 500),
        ("internal_error", 500),
        (None, 500),
    ],
)
def test_a_fail_is_answered_by_its_code(code: str | None, status: int) -> None:
    assert status_of(Fail("it failed", code=code)) == status


def test_an_error_the_server_never_answers_has_no_status() -> None:
    with pytest.raises(LookupError, match="StreamClosed"):
        status_of(StreamClosed())
