"""``server/http/errors.py``: every error the server answers, its row of the one
table, the answer in each API's shape, and no status written by hand elsewhere."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import sluicegate.engines
import sluicegate.server
from sluicegate.core import errors as core_errors
from sluicegate.core.errors import (
    BodyTooLarge,
    EngineError,
    EngineRefused,
    EngineTimeout,
    EngineUnavailable,
    ModelNotFound,
    ProtocolError,
    RequestError,
    SluicegateError,
    StreamClosed,
    StreamError,
    UnsupportedMediaType,
    UpstreamFailed,
    UpstreamsBusy,
    UpstreamTimedOut,
)
from sluicegate.core.events import Fail
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.server.http import answers, errors
from sluicegate.server.http.answers import status_of
from sluicegate.server.http.errors import (
    FIRST_TOKEN_TIMEOUT,
    REQUEST_TIMEOUT,
    SERVER_SHUTDOWN,
    AdmissionError,
    Forbidden,
    HostNotAllowed,
    OverQuota,
    Unauthenticated,
    Unavailable,
)


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
        (UpstreamFailed("no stream"), 502),
        (UpstreamsBusy("all busy", retry_after_s=2.0), 503),
        (UpstreamTimedOut("late"), 504),
    ],
)
def test_each_error_class_has_its_status(error: SluicegateError, status: int) -> None:
    assert status_of(error) == status


@pytest.mark.parametrize("status", [400, 429, 503])
def test_an_engine_refusal_is_answered_with_its_own_status(status: int) -> None:
    assert status_of(EngineRefused("upstream said no", status)) == status


def test_a_gateway_refusal_takes_its_rows_status_and_type_but_its_own_code() -> None:
    refusal = UpstreamsBusy("every upstream is busy", retry_after_s=1.5, code="busy")
    described = answers.describe(refusal)
    assert (described.status, described.error_type) == (503, "server_error")
    assert (described.code, described.retry_after_s) == ("busy", 2)
    failed = answers.describe(UpstreamFailed("broke", error_type="upstream_oops"))
    assert (failed.status, failed.error_type, failed.code) == (
        502,
        "upstream_oops",
        None,
    )


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


# -- one home, one table -------------------------------------------------------

SERVER = Path(sluicegate.server.__file__).parent


@functools.cache
def _server_modules() -> tuple[tuple[str, ast.Module], ...]:
    """Every module of the server, imported, with its syntax tree (once)."""
    found = []
    for info in pkgutil.walk_packages([str(SERVER)], "sluicegate.server."):
        module = importlib.import_module(info.name)
        path = Path(str(module.__file__))
        found.append((info.name, ast.parse(path.read_text(), str(path))))
    return tuple(found)


def _answered_classes() -> set[type[SluicegateError]]:
    """Every ``SluicegateError`` subclass there is, but those the server never
    answers (a client's misuse, a broken protocol: raised to a caller)."""
    found: set[type[SluicegateError]] = set()
    todo: list[type[SluicegateError]] = [SluicegateError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("sluicegate.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return {cls for cls in found if not issubclass(cls, ProtocolError | StreamError)}


def test_every_error_class_has_a_row() -> None:
    for _ in _server_modules():  # every module imported: every class defined
        pass
    classes = _answered_classes()
    assert {errors.NotFound, core_errors.EngineTimeout} <= classes
    for cls in classes:
        kind = errors.kind_of(cls)
        assert 400 <= kind.status <= 599, cls
        assert kind.error_type in {
            "invalid_request_error",
            "rate_limit_error",
            "server_error",
        }, cls


def test_the_server_defines_its_errors_in_one_module() -> None:
    strays = []
    for name, tree in _server_modules():
        module = importlib.import_module(name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or name == errors.__name__:
                continue
            cls = getattr(module, node.name, None)
            if isinstance(cls, type) and issubclass(cls, SluicegateError):
                strays.append(f"{name}.{node.name}")
    assert strays == []


def test_every_error_the_server_raises_has_a_row() -> None:
    raised = set()
    for name, tree in _server_modules():
        module = importlib.import_module(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                called = node.exc.func
                if isinstance(called, ast.Name):
                    raised.add(getattr(module, called.id, None))
    answered = {
        c for c in raised if isinstance(c, type) and issubclass(c, SluicegateError)
    }
    assert {errors.Unavailable, RequestError, errors.CursorEvicted} <= answered
    for cls in answered:
        errors.kind_of(cls)  # raises LookupError for a class with no row


# Calls that take an HTTP status, and where: a positional index or a keyword.
_STATUS_ARGS = {
    "json_answer": (1, "status"),
    "Response": (1, "status_code"),
    "JSONResponse": (1, "status_code"),
    "RedirectResponse": (1, "status_code"),
    "HTTPException": (0, "status_code"),
    "EngineRefused": (1, "status"),
    "UpstreamFailed": (1, "status"),
    "UpstreamsBusy": (1, "status"),
    "UpstreamTimedOut": (1, "status"),
    "answered": (0, "status"),
    "record": (1, "status"),
}


def _is_error_status(node: ast.expr) -> bool:
    value = node.value if isinstance(node, ast.Constant) else None
    return type(value) is int and 400 <= value <= 599


def _literal_statuses(tree: ast.Module) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else getattr(func, "id", "")
            )
            where = _STATUS_ARGS.get(name)
            if where is None:
                continue
            index, keyword = where
            args = node.args[index : index + 1] + [
                k.value for k in node.keywords if k.arg == keyword
            ]
            for arg in args:
                if _is_error_status(arg):
                    yield node.lineno
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (
                    zip(target.elts, node.value.elts, strict=False)
                    if isinstance(target, ast.Tuple)
                    and isinstance(node.value, ast.Tuple)
                    else [(target, node.value)]
                )
                for name, value in pairs:
                    if (
                        isinstance(name, ast.Name)
                        and name.id.endswith("status")
                        and _is_error_status(value)
                    ):
                        yield node.lineno
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "status"
                    and _is_error_status(value)
                ):
                    yield node.lineno


def test_no_answer_writes_its_status_by_hand() -> None:
    found = [
        f"{name}:{line}"
        for name, tree in _server_modules()
        if name != errors.__name__
        for line in _literal_statuses(tree)
    ]
    assert found == []


def test_no_engine_refuses_with_a_status_written_by_hand() -> None:
    """An engine's own refusals name their class (a row of ``KINDS``); only an
    upstream's status, read through its table, is passed on as a number."""
    engines = Path(sluicegate.engines.__file__).parent
    found = [
        f"{path.relative_to(engines)}:{line}"
        for path in sorted(engines.rglob("*.py"))
        for line in _literal_statuses(ast.parse(path.read_text(), str(path)))
    ]
    assert found == []


def test_the_scan_sees_a_status_written_by_hand() -> None:
    tree = ast.parse(
        "json_answer(p, 404)\nResponse(b, status_code=503)\n"
        "send({'type': 'http.response.start', 'status': 503})\n"
        "state, status = ERRORED, 500\nsend({'status': 200})\n"
    )
    assert sorted(_literal_statuses(tree)) == [1, 2, 3, 4]


# -- the shapes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (errors.NotFound("No stream with that id"), 404, "not_found_error"),
        (errors.OverQuota("slow down", "rate_limited", 3), 429, "rate_limit_error"),
        (errors.Unavailable("busy", "queue_full", 1), 503, "overloaded_error"),
        (errors.ProducedElsewhere("resp_1"), 409, "invalid_request_error"),
        (EngineError("broke"), 500, "api_error"),
    ],
)
def test_an_answer_before_the_first_byte_has_each_apis_shape(
    error: SluicegateError, status: int, kind: str
) -> None:
    described = answers.describe(error, 7)
    openai = answers.error_answer(error, 7)
    assert openai.status_code == status
    assert json.loads(bytes(openai.body)) == {
        "error": {
            "message": described.message,
            "type": described.error_type,
            "param": described.param,
            "code": described.code,
        }
    }
    anthropic = answers.error_answer(error, 7, Endpoint.MESSAGES)
    assert anthropic.status_code == status
    assert json.loads(bytes(anthropic.body)) == {
        "type": "error",
        "error": {"type": kind, "message": described.message},
    }
    assert openai.headers.get("retry-after") == anthropic.headers.get("retry-after")


def test_a_store_error_never_shows_the_stores_own_text() -> None:
    exc = errors.RedisUnavailable("redis://secret-host:6379 refused")
    body = json.loads(bytes(answers.error_answer(exc, 2).body))["error"]
    assert body["code"] == errors.STORE_UNAVAILABLE
    assert "secret-host" not in body["message"]
    full = answers.describe(errors.RedisFull("OOM"), 2)
    assert (full.status, full.code, full.retry_after_s) == (503, errors.STORE_FULL, 2)


def test_an_evicted_cursor_names_the_param_the_route_read() -> None:
    answer = answers.error_answer(errors.CursorEvicted("dropped"), 2, param="after")
    assert answer.status_code == 410
    assert "retry-after" not in answer.headers
    assert json.loads(bytes(answer.body))["error"] == {
        "message": "dropped",
        "type": "invalid_request_error",
        "param": "after",
        "code": "cursor_evicted",
    }
