"""Event streams carry the headers that keep proxies from buffering them."""

from __future__ import annotations

import httpx
import pytest

from .wire import collect

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_headers_are_proxy_safe_and_never_compressed(
    http: httpx.Client, path: str
) -> None:
    """Event-stream type, no-cache, no proxy buffering, no length, no gzip.

    Headers do not depend on the answer's length, so 16 tokens keep the test
    fast.
    """
    payload = (
        {"messages": [{"role": "user", "content": "Write a long story."}]}
        if path.endswith("chat/completions")
        else {"prompt": "Write a long story."}
    )
    recorded, _ = collect(
        http, path, {**payload, "max_tokens": 16}, {"Accept-Encoding": "gzip"}
    )
    headers = recorded.headers

    assert headers["content-type"].split(";")[0].strip() == "text/event-stream"
    assert "no-cache" in headers["cache-control"]
    assert headers["x-accel-buffering"] == "no"
    assert "content-length" not in headers
    assert "content-encoding" not in headers  # and the raw bytes parsed as SSE
