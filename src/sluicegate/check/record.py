"""The I/O half of ``check``: send the probe requests and record what comes back.

Everything recorded is a ``Transcript`` (see ``check.transcript``); grading is
``check.probes.run_probes``, which does no I/O. Requests go one at a time, so
that temperature-0 answers are comparable across requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import httpx

from sluicegate.check import names
from sluicegate.check.record_fidelity import PREFILL_TOKENS, record_fidelity
from sluicegate.check.semantics import plain
from sluicegate.check.transcript import Transcript
from sluicegate.client import Client, StreamResult

__all__ = ["discover_model", "record"]

PROMPT = "List the numbers from one to twelve in words, separated by commas."
MULTIBYTE_PROMPT = "Write the Japanese word for cat (猫) and three animal emoji."
INVALID_PARAMS: Mapping[str, Mapping[str, Any]] = {
    "max_tokens": {"max_tokens": -1},
    "temperature": {"temperature": 5},
    "messages": {"messages": "not a list"},
}
TOOL_PROMPT = "What is the weather in Paris?"
WEATHER_TOOL: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOL_MAX_TOKENS = 64
"""Room for one call: a model that is made to call needs about 25 tokens."""
TOOL_CUT_MAX_TOKENS = 3
"""Too few for any call to ``get_weather``: its arguments need a city."""
SCHEMA_PROMPT = "Describe a cat as JSON: its name and how many legs it has."
ANIMAL_FORMAT: Mapping[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "animal",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
            "required": ["name", "legs"],
            "additionalProperties": False,
        },
    },
}
SCHEMA_MAX_TOKENS = 64


def discover_model(client: Client) -> str:
    """The first model id ``GET /v1/models`` lists, or ``"default"``."""
    try:
        data = client.http.get("models").json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return "default"
    return str(data[0]["id"]) if data and "id" in data[0] else "default"


def _from_result(
    request: Mapping[str, Any], path: str, result: StreamResult, closed: bool = False
) -> Transcript:
    return Transcript(
        request=request,
        path=path,
        status=result.status,
        headers=dict(result.headers),
        body=result.raw,
        ttft_s=result.timing.first_token_s,
        head_s=result.timing.head_s,
        elapsed_s=result.timing.end_s,
        closed_early=closed,
    )


def _stream(
    client: Client, body: dict[str, Any], close_after_first: bool = False
) -> Transcript:
    params = {k: v for k, v in body.items() if k not in ("model", "messages")}
    options = params.pop("stream_options", None)
    include_usage = bool(options)
    if options and set(options) != {"include_usage"}:
        params["stream_options"] = options  # sent as given
    params.pop("stream", None)
    with client.stream_chat(
        body["messages"], model=body["model"], include_usage=include_usage,
        record=True, **params,
    ) as stream:  # fmt: skip
        for _ in stream:
            if close_after_first:
                stream.close()  # closes the connection: the server should abort
                break
        result = stream.result()
    return _from_result(body, "chat/completions", result, close_after_first)


def _plain(client: Client, body: dict[str, Any]) -> Transcript:
    start = time.monotonic()
    try:
        response = client.http.post("chat/completions", json=body)
    except httpx.HTTPError as exc:
        return Transcript(request=body, status=None, body=str(exc).encode())
    return Transcript(
        request=body, status=response.status_code, headers=dict(response.headers),
        body=response.content, elapsed_s=time.monotonic() - start,
    )  # fmt: skip


def _chat(model: str, prompt: str, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
    }
    body.update(params)
    return body


def _stops(text: str) -> tuple[list[str], list[str]]:
    # Cut from the middle of the reference text so each stop spans token edges.
    third = max(1, len(text) // 3)
    one = [text[third : third + 4] or "\n\n"]
    many = ["\u00a7never\u00a7", text[2 * third : 2 * third + 3] or ".", "zqzq"]
    return one, many


def record(
    client: Client,
    model: str,
    *,
    max_tokens: int = 24,
    progress: Callable[[str], None] = lambda name: None,
    prefill_tokens: int = PREFILL_TOKENS,
) -> dict[str, Transcript]:
    """Send every probe request to ``client``'s server, one at a time.

    Args:
        client: a client for the server (its time limits apply to every request).
        model: the model name to ask for.
        max_tokens: the answer length (tokens) of ordinary requests.
        progress: called with each exchange's name before it is sent.
        prefill_tokens: about how many tokens the slow-prefill prompt has.

    Returns:
        ``{name: Transcript}`` with the names of ``check.names``; invalid requests
        are ``invalid_<what>``.
    """
    base = {"temperature": 0, "max_tokens": max_tokens}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    out: dict[str, Transcript] = {}

    def run(name: str, send: Callable[[], Transcript]) -> Transcript:
        progress(name)
        out[name] = send()
        return out[name]

    run(names.STREAM, lambda: _stream(client, _chat(model, PROMPT, **base, **usage)))
    reference = run(names.PLAIN, lambda: _plain(client, _chat(model, PROMPT, **base)))
    run(
        names.NO_USAGE,
        lambda: _stream(client, _chat(model, PROMPT, **base, stream=True)),
    )
    multi = _chat(model, MULTIBYTE_PROMPT, **base)
    run(names.MULTIBYTE, lambda: _stream(client, {**multi, **usage}))
    run(names.MULTIBYTE_PLAIN, lambda: _plain(client, multi))
    text = _reference_text(reference)
    if text:
        one, many = _stops(text)
        for name, stop in ((names.STOP_ONE, one), (names.STOP_MANY, many)):
            body = _chat(model, PROMPT, **base, **usage, stop=stop)
            run(name, partial(_stream, client, body))
    max1 = _chat(model, PROMPT, **{**base, "max_tokens": 1}, **usage)
    run(names.MAX1, lambda: _stream(client, max1))
    run(names.N2, lambda: _stream(client, _chat(model, PROMPT, **base, **usage, n=2)))
    for what, bad in INVALID_PARAMS.items():
        body = {**_chat(model, PROMPT, **base, **usage), **bad}
        run(f"{names.INVALID}_{what}", partial(_stream, client, body))
    _record_tools(client, model, run)
    record_fidelity(
        client, model, run, partial(_stream, client), partial(_plain, client),
        prompt=PROMPT, tool=WEATHER_TOOL, prefill_tokens=prefill_tokens,
    )  # fmt: skip
    long = _chat(model, PROMPT, temperature=0, max_tokens=512, **usage)
    run(names.DISCONNECTED, lambda: _stream(client, long, close_after_first=True))
    after = _chat(model, PROMPT, **base, **usage)
    run(names.AFTER_DISCONNECT, lambda: _stream(client, after))
    return out


def _record_tools(
    client: Client,
    model: str,
    run: Callable[[str, Callable[[], Transcript]], Transcript],
) -> None:
    # Each exchange streamed and not, with the same body: the probes compare them.
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    choice = {"type": "function", "function": {"name": "get_weather"}}
    tools = {"tools": [WEATHER_TOOL], "tool_choice": choice, "temperature": 0}
    call = _chat(model, TOOL_PROMPT, **tools, max_tokens=TOOL_MAX_TOKENS)
    cut = {**call, "max_tokens": TOOL_CUT_MAX_TOKENS}
    schema = _chat(
        model, SCHEMA_PROMPT, response_format=ANIMAL_FORMAT, temperature=0,
        max_tokens=SCHEMA_MAX_TOKENS,
    )  # fmt: skip
    for stream_name, plain_name, body in (
        (names.TOOLS, names.TOOLS_PLAIN, call),
        (names.TOOLS_CUT, names.TOOLS_CUT_PLAIN, cut),
        (names.SCHEMA, names.SCHEMA_PLAIN, schema),
    ):
        run(stream_name, partial(_stream, client, {**body, **usage}))
        run(plain_name, partial(_plain, client, body))


def _reference_text(t: Transcript) -> str:
    return plain(t)[0] if t.status == 200 else ""
