"""``sluicegate doctor --upstream`` against a real server (the session's)."""

from __future__ import annotations

import io

import pytest

from sluicegate.doctor_upstream import diagnose_upstreams

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


def test_a_base_without_v1_is_told_the_base_with_it(base_url: str) -> None:
    """The server's root has no ``/models`` (404): the doctor said only
    "answered 404"; it now asks ``/v1`` too and says to use it."""
    assert not base_url.endswith("/v1")
    out = io.StringIO()
    assert diagnose_upstreams([base_url, f"{base_url}/v1"], out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        f"upstream {base_url}/models: error: answered 404; {base_url}/v1/models"
        f" lists 1 models: use --upstream {base_url}/v1"
    )
    assert lines[1].startswith(f"upstream {base_url}/v1/models: 1 models: ")
    bare = base_url.removeprefix("http://")  # no scheme either
    out = io.StringIO()
    assert diagnose_upstreams([bare], out) == 1
    assert f"use --upstream {base_url}/v1" in out.getvalue()
