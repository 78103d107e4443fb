"""Connection limits: the default cap follows the open-file limit; bad limits raise."""

from __future__ import annotations

import resource

import pytest

from sluicegate.server.http.connections import (
    DEFAULT_MAX_CONNECTIONS,
    ConnectionLimits,
    LimitedH11Protocol,
    default_max_connections,
    protocol_class,
)


@pytest.mark.parametrize(
    ("soft", "cap"),
    [
        (resource.RLIM_INFINITY, DEFAULT_MAX_CONNECTIONS),
        (1_000_000, DEFAULT_MAX_CONNECTIONS),
        (1024, 1024 - 64),
        (10, 1),
    ],
)
def test_the_default_cap_stays_under_the_open_file_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, cap: int
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, resource.RLIM_INFINITY))
    assert default_max_connections() == cap


@pytest.mark.parametrize(
    "field", ["header_timeout_s", "body_timeout_s", "max_header_bytes"]
)
def test_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ConnectionLimits(**{field: 0})


def test_each_protocol_class_carries_its_own_limits() -> None:
    short = protocol_class(ConnectionLimits(header_timeout_s=1))
    long = protocol_class(ConnectionLimits(header_timeout_s=60))
    assert issubclass(short, LimitedH11Protocol)
    assert (short.limits.header_timeout_s, long.limits.header_timeout_s) == (1, 60)
    assert LimitedH11Protocol.limits == ConnectionLimits()
