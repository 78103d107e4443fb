"""The README's "Try it" examples, run as written against the real default model.

Each is taken from README.md's text (the server's address swapped in), so an
example that loses its ``max_tokens`` (and would run to the server's default
of 1024 tokens, minutes on a CPU) fails here.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import httpx
import pytest

from .wire import collect

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

README = Path(__file__).resolve().parents[2] / "README.md"


def _try_it_blocks() -> tuple[str, str, str]:
    """The ``sh`` block and the openai and anthropic ``python`` blocks of "Try it"."""
    section = README.read_text().split("## Try it", 1)[1].split("\n## ", 1)[0]
    (sh,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    openai_sdk, anthropic_sdk = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "from openai import" in openai_sdk
    assert "from anthropic import" in anthropic_sdk
    return sh, openai_sdk, anthropic_sdk


def _run(code: str) -> list[str]:
    """Run one example as written; the lines it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    return printed.getvalue().splitlines()


def test_the_curl_example_sets_max_tokens_and_finishes(http: httpx.Client) -> None:
    sh, _, _ = _try_it_blocks()
    words = shlex.split(sh.replace("\\\n", " "))
    assert words[:2] == ["curl", "-N"]
    path = "/" + words[2].split("/", 1)[1]
    body = json.loads(words[words.index("-d") + 1])
    assert body["max_tokens"] <= 64, body
    _, choices = collect(http, path, body)
    assert choices[0].finish_reason in ("stop", "length")


def test_the_openai_example_sets_max_tokens_and_finishes(base_url: str) -> None:
    _, python, _ = _try_it_blocks()
    assert "max_tokens=" in python
    code = python.replace("http://127.0.0.1:8000/v1", f"{base_url.rstrip('/')}/v1")
    lines = _run(code)
    assert any("finish_reason='" in line for line in lines), lines[-3:]
    usage = re.search(r"completion_tokens=(\d+)", lines[-1])
    assert usage is not None, lines[-1]
    assert int(usage.group(1)) <= 64


def test_the_anthropic_example_sets_max_tokens_and_finishes(base_url: str) -> None:
    _, _, python = _try_it_blocks()
    assert "max_tokens=" in python
    code = python.replace("http://127.0.0.1:8000", base_url.rstrip("/"))
    lines = _run(code)
    stop_reason = lines[-1].split(" ", 1)[0]
    assert stop_reason in ("end_turn", "max_tokens"), lines[-1]
    usage = re.search(r"output_tokens=(\d+)", lines[-1])
    assert usage is not None, lines[-1]
    assert 0 < int(usage.group(1)) <= 64
