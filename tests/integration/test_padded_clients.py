"""Padded streams of the real model: their sizes, and real clients reading them.

The server pads by default. On the wire, a content event's size must not follow
its text; the official openai SDK and the AI SDK (Node, ``tests/js``) must read
the padded stream as they read a plain one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from sluicegate.core.wire.sse import SSEDecoder

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

JS = Path(__file__).resolve().parents[1] / "js"
PROMPTS = [
    "Write a short story about a dragon and a castle.",
    "List some numbers: 12, 345, 6789, and explain them.",
    "Describe the weather in Paris in spring.",
]


def _content_sizes(http: httpx.Client, prompt: str) -> dict[int, set[int]]:
    """Content event sizes (bytes) by their text's JSON length (bytes)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": 48,
        "temperature": 0,
    }
    sizes: dict[int, set[int]] = {}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        raw = b"".join(response.iter_raw())
    for event in SSEDecoder().feed(raw):
        if event.data == "[DONE]":
            continue
        payload = json.loads(event.data)
        assert "obfuscation" in payload
        text = payload["choices"][0]["delta"].get("content")
        if text:
            key = len(json.dumps(text, ensure_ascii=False)) - 2
            size = len(event.data.encode()) + len(b"data: \n\n")
            sizes.setdefault(key, set()).add(size)
    return sizes


def test_content_event_sizes_of_the_real_model_do_not_follow_their_text(
    http: httpx.Client,
) -> None:
    sizes: dict[int, set[int]] = {}
    for prompt in PROMPTS:
        for length, seen in _content_sizes(http, prompt).items():
            sizes.setdefault(length, set()).update(seen)
    short = {length: seen for length, seen in sizes.items() if length <= 16}
    assert len(short) >= 4, sizes  # tokens of several lengths were seen
    assert len(set().union(*short.values())) == 1, sizes  # and one size for all


def test_the_openai_sdk_reads_a_padded_stream(
    sdk: openai.OpenAI, model_id: str
) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "Name three colors."}],
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    # The SDK keeps fields it does not know as attributes.
    assert all(isinstance(getattr(c, "obfuscation", None), str) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage is not None
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in (
        "stop",
        "length",
    )


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node 20")
def test_the_ai_sdk_reads_a_padded_stream(
    sdk: openai.OpenAI, model_id: str, base_url: str
) -> None:
    if not (JS / "node_modules" / "ai").is_dir():
        pytest.fail("tests/js is not installed: run scripts/install-js-deps")
    prompt, max_tokens = "Name three animals.", 16
    result = subprocess.run(
        [
            "node",
            "ai_sdk_stream.mjs",
            f"{base_url}/v1",
            model_id,
            prompt,
            str(max_tokens),
        ],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout)
    answer = sdk.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
    )
    assert read["text"] == answer.choices[0].message.content
    assert read["parts"] > 1
    assert read["finishReason"] in ("stop", "length")
    assert answer.usage is not None
    assert read["usage"]["outputTokens"] == answer.usage.completion_tokens
