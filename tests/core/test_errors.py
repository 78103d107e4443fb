from __future__ import annotations

import pytest

from sluicegate.core.errors import (
    BodyTooLarge,
    EngineError,
    EngineRefused,
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
    UnsupportedMediaType,
    UpstreamFailed,
    UpstreamsBusy,
    UpstreamTimedOut,
    bounded_repr,
)


def test_protocol_error_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ProtocolError("x")


def test_protocol_errors_carry_a_status_hint() -> None:
    assert LocalProtocolError("bug").status_hint == 500
    assert RemoteProtocolError("peer").status_hint == 502
    assert RemoteProtocolError("peer", status_hint=400).status_hint == 400
    assert isinstance(LocalProtocolError("bug"), SluicegateError)


def test_request_errors_carry_param_and_code() -> None:
    error = RequestError("n must be >= 1, got 0", param="n", code="invalid_value")
    assert (error.message, error.param, error.code) == (
        "n must be >= 1, got 0",
        "n",
        "invalid_value",
    )
    assert error.error_type == "invalid_request_error"


def test_model_not_found_names_the_model_and_what_is_served() -> None:
    error = ModelNotFound("gpt-9", ["gemma"])
    assert error.param == "model"
    assert error.code == "model_not_found"
    assert "'gpt-9'" in error.message
    assert "['gemma']" in error.message


def test_body_too_large_gives_limit_and_size() -> None:
    error = BodyTooLarge(limit_bytes=10, seen_bytes=11)
    assert error.code == "request_too_large"
    assert "11 bytes" in error.message
    assert "limit is 10" in error.message
    decoded = BodyTooLarge(10, 10, "gzip")  # how much more is not known
    assert decoded.message == (
        "The request body decodes (gzip) to more than 10 bytes; the limit is 10"
    )


def test_unsupported_media_type_names_the_type_or_the_coding() -> None:
    plain = UnsupportedMediaType("text/plain")
    assert (plain.code, "got 'text/plain'" in plain.message) == (
        "unsupported_media_type",
        True,
    )
    coded = UnsupportedMediaType("application/json", "br")
    assert coded.code == "unsupported_content_encoding"
    assert coded.message == (
        "The request body must be sent as gzip, deflate or identity; got 'br'"
    )


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


@pytest.mark.parametrize(
    "value",
    [
        {"5": 150},
        [[5], []],
        "it's",
        (1,),
        (1, 2),
        (),
        [],
        {},
        None,
        True,
        1.5,
        -(10**40),
        {"a": [1, {"b": (2, "c")}]},
    ],
)
def test_bounded_repr_of_a_small_value_is_its_repr(value: object) -> None:
    assert bounded_repr(value) == repr(value)


def test_bounded_repr_cuts_nesting_at_max_depth() -> None:
    nested: list[object] = []
    deep: dict[str, object] = {}
    for _ in range(5000):  # deeper than repr() can recurse
        nested = [nested]
        deep = {"a": deep}
    assert bounded_repr(nested, max_depth=2) == "[[[...]]]"
    assert bounded_repr(deep, max_depth=1) == "{'a': {...}}"
    assert bounded_repr(((1,),), max_depth=1) == "((...),)"
    assert bounded_repr([[], {}], max_depth=1) == "[[], {}]"  # empty ones show


@pytest.mark.parametrize(
    "value",
    [
        "x" * 1_000_000,
        ["x" * 1000] * 1000,
        list(range(100_000)),
        {str(i): i for i in range(100_000)},
        {"k" * 1000: 1},
    ],
)
def test_bounded_repr_of_a_long_value_is_cut_to_max_chars(value: object) -> None:
    text = bounded_repr(value, max_chars=50)
    assert len(text) == 50
    assert text.endswith("...")
    assert repr(value).startswith(text[:-3])


def test_bounded_repr_names_an_integer_too_long_to_print() -> None:
    assert bounded_repr(10**5000) == "<an integer of 16610 bits>"  # int() refuses it
    assert bounded_repr([1, 10**5000], max_chars=30) == "[1, <an integer of 16610 bi..."


def test_an_engine_refusal_carries_its_status_and_picks_the_error_type() -> None:
    limited = EngineRefused("slow down", 429, retry_after_s=1.5, code="rate_limited")
    assert (limited.status, limited.retry_after_s) == (429, 1.5)
    assert (limited.error_type, limited.error_code, limited.param) == (
        "invalid_request_error",
        "rate_limited",
        None,
    )
    assert EngineRefused("down", 503).error_type == "server_error"
    assert EngineRefused("x", 400, error_type="invalid_value").error_type == (
        "invalid_value"
    )
    assert isinstance(limited, EngineError)


def test_a_gateway_refusal_leaves_its_status_and_type_to_its_class() -> None:
    busy = UpstreamsBusy("every upstream is busy", retry_after_s=1.0)
    assert isinstance(busy, EngineRefused)
    assert (busy.status, busy.error_type, busy.retry_after_s) == (None, None, 1.0)
    timed_out = UpstreamTimedOut("late", code="timeout")
    assert (timed_out.status, timed_out.error_code) == (None, "timeout")
    assert UpstreamFailed("broke", error_type="oops").error_type == "oops"


@pytest.mark.parametrize("status", [200, 302, 399, 600])
def test_an_engine_refusal_is_an_error_status(status: int) -> None:
    with pytest.raises(ValueError, match="400-599"):
        EngineRefused("x", status)


def test_rename_params_names_another_apis_parameter_in_param_and_message() -> None:
    names = {"max_tokens": "max_output_tokens", "stop": "stop_sequences"}
    long = RequestError("max_tokens is 9 but the window is 8", param="max_tokens")
    long.rename_params(names)
    assert (long.param, long.message) == (
        "max_output_tokens",
        "max_output_tokens is 9 but the window is 8",
    )
    assert str(long) == long.message
    stop = RequestError("Invalid value for 'stop': ''", param="stop[0]")
    stop.rename_params(names)
    assert (stop.param, stop.message) == (
        "stop_sequences",
        "Invalid value for 'stop_sequences': ''",
    )
    for param in (None, "temperature"):  # nothing to rename
        kept = RequestError("Bad temperature", param=param)
        kept.rename_params(names)
        assert (kept.param, kept.message) == (param, "Bad temperature")


def test_rename_params_maps_an_indexed_path_keeping_its_indices() -> None:
    names = {
        "tools[].function.parameters": "tools[].input_schema",
        "tools": "tool_list",
    }
    error = RequestError(
        "tools[3].function.parameters is too deep", param="tools[3].function.parameters"
    )
    error.rename_params(names)
    assert (error.param, error.message) == (
        "tools[3].input_schema",
        "tools[3].input_schema is too deep",
    )
    assert str(error) == error.message
    # Another path under the same head falls back to the head's name.
    other = RequestError(
        "tools[3].function.name is bad", param="tools[3].function.name"
    )
    other.rename_params(names)
    assert other.param == "tool_list"


def test_rename_params_maps_one_indexed_element_and_what_is_under_it() -> None:
    names = {"messages[0]": "instructions", "messages[2]": "input[1]"}
    error = RequestError(
        "The chat template cannot render messages[2] (role 'user')",
        param="messages[2]",
    )
    error.rename_params(names)
    assert (error.param, error.message) == (
        "input[1]",
        "The chat template cannot render input[1] (role 'user')",
    )
    deeper = RequestError("Bad 'messages[2].role'", param="messages[2].role")
    deeper.rename_params(names)
    assert (deeper.param, str(deeper)) == ("input[1].role", "Bad 'input[1].role'")
    unmapped = RequestError("Bad 'messages[1]'", param="messages[1]")
    unmapped.rename_params(names)  # no name for it: kept
    assert unmapped.param == "messages[1]"
