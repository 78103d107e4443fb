from __future__ import annotations

import pytest

from sluicegate.core.errors import (
    BodyTooLarge,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    LocalProtocolError,
    ModelNotFound,
    ProtocolError,
    RemoteProtocolError,
    RequestError,
    SluicegateError,
    StreamClosed,
    StreamConsumed,
    StreamError,
)


def test_protocol_error_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ProtocolError("x")


def test_protocol_errors_carry_a_status_hint() -> None:
    assert LocalProtocolError("bug").status_hint == 500
    assert RemoteProtocolError("peer").status_hint == 502
    assert RemoteProtocolError("peer", status_hint=400).status_hint == 400
    assert isinstance(LocalProtocolError("bug"), SluicegateError)


def test_request_errors_carry_param_code_and_status() -> None:
    error = RequestError("n must be >= 1, got 0", param="n", code="invalid_value")
    assert (error.message, error.param, error.code, error.status) == (
        "n must be >= 1, got 0",
        "n",
        "invalid_value",
        400,
    )
    assert error.error_type == "invalid_request_error"


def test_model_not_found_names_the_model_and_what_is_served() -> None:
    error = ModelNotFound("gpt-9", ["gemma"])
    assert error.status == 404
    assert error.param == "model"
    assert error.code == "model_not_found"
    assert "'gpt-9'" in error.message
    assert "['gemma']" in error.message


def test_body_too_large_gives_limit_and_size() -> None:
    error = BodyTooLarge(limit_bytes=10, seen_bytes=11)
    assert error.status == 413
    assert error.code == "request_too_large"
    assert "11 bytes" in error.message
    assert "limit is 10" in error.message


def test_engine_errors_say_whether_a_retry_may_help() -> None:
    assert (EngineError.retryable, EngineError.code) == (False, "engine_error")
    assert (EngineUnavailable.retryable, EngineUnavailable.code) == (
        True,
        "engine_unavailable",
    )
    assert (EngineTimeout.retryable, EngineTimeout.code) == (True, "timeout")


def test_stream_misuse_errors_build_their_own_message() -> None:
    assert isinstance(StreamConsumed(), StreamError)
    assert "consumed" in str(StreamConsumed())
    assert "closed" in str(StreamClosed())
