"""A hostile upstream's stream through a real gateway: each bound ends it as said.

One fake upstream answers by the user message's text; one gateway process with
a ledger file sits in front of it; clients are the official ``openai`` SDK and
httpx (for the raw in-band error). Each case checks what the client got and the
ledger's row: past a reader bound, or a call to a tool not offered, a 502
before content and one in-band ``upstream_protocol_error`` after it; a usage
that cannot be true billed as the gateway's own estimate. (200,000 deltas in
one burst, delivered whole to a client that reads, are ``many_deltas`` in
``test_hostile_upstream.py``, under its liveness and memory checks too.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow, read_rows

from .gateway import (
    READ_TIMEOUT_S,
    FakeUpstream,
    Reply,
    api_base,
    chat_chunk,
    usage_chunk,
)
from .servers import ServerProcess, StartServer

pytestmark = pytest.mark.integration

MODEL = "hostile"
TOOLS: Any = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def tool_chunk(name: str) -> str:
    call = {"index": 0, "id": "call_1", "type": "function"}
    call["function"] = {"name": name, "arguments": "{}"}
    choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
    return json.dumps({"choices": [choice]})


def script(case: str) -> list[str]:
    """The events the fake upstream sends for ``case`` (the user's message)."""
    done = [chat_chunk(0, None, "stop"), usage_chunk(3, 2), "[DONE]"]
    huge_line = "x" * (2 << 20)  # past max_line_bytes (1 MiB): never JSON-parsed
    return {
        "long line first": [huge_line],
        "long line later": [chat_chunk(0, "hi"), huge_line],
        "tool first": [tool_chunk("rm_rf"), *done],
        "tool later": [chat_chunk(0, "hi"), tool_chunk("rm_rf"), *done],
        "tool offered": [tool_chunk("get_time"), *done],
        "usage": [
            chat_chunk(0, "a"),
            chat_chunk(0, "b", "stop"),
            usage_chunk(3, 9_000_000_000_000_000_000),
            "[DONE]",
        ],
        "empty": [chat_chunk(0, None, "stop"), "[DONE]"],
        "prompt usage": [
            chat_chunk(0, "a"),
            chat_chunk(0, "b", "stop"),
            usage_chunk(10**12, 2),
            "[DONE]",
        ],
    }[case]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    def reply(body: dict[str, Any]) -> Reply:
        return Reply(events=script(body["messages"][-1]["content"]))

    with FakeUpstream(reply) as fake:
        yield fake


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reader-limits") / "ledger.sqlite3"


@pytest.fixture(scope="module")
def gateway(
    start_server: StartServer, upstream: FakeUpstream, ledger: Path
) -> ServerProcess:
    # Failures must not eject the one upstream: every case here is one.
    config = ledger.with_name("upstreams.toml")
    config.write_text(
        f'[[models]]\nid = "{MODEL}"\neject_after_failures = 1000\n'
        f'health_interval_s = 0\n[[models.upstreams]]\nurl = "{upstream.url}"\n',
        encoding="utf-8",
    )
    return start_server(
        "gateway-hostile",
        *("--upstreams", str(config), "--ledger", str(ledger)),
        *("--log-level", "warning"),
    )


@pytest.fixture
def client(gateway: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=api_base(gateway), api_key="none", timeout=READ_TIMEOUT_S
    ) as sdk:
        yield sdk


def row_of(ledger: Path, request_id: str) -> LedgerRow:
    deadline = time.monotonic() + READ_TIMEOUT_S
    while time.monotonic() < deadline:
        for row in read_rows(ledger):
            if row.request_id == request_id:
                return row
        time.sleep(0.05)
    pytest.fail(f"no ledger row for {request_id}")


def last_row(ledger: Path, before: int) -> LedgerRow:
    deadline = time.monotonic() + READ_TIMEOUT_S
    while time.monotonic() < deadline:
        rows = read_rows(ledger)
        if len(rows) > before:
            return rows[-1]
        time.sleep(0.05)
    pytest.fail("no new ledger row")


def raw_stream(gateway: ServerProcess, case: str, **extra: Any) -> list[bytes]:
    """The gateway's answer to ``case`` as SSE events (its status must be 200)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": case}],
        "stream": True,
        **extra,
    }
    url = f"{api_base(gateway)}/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=READ_TIMEOUT_S) as answer:
        assert answer.status_code == 200
        raw = answer.read()
    return [e for e in raw.split(b"\n\n") if e]


@pytest.mark.parametrize("case", ["long line first", "tool first"])
def test_a_breach_before_content_is_a_502_and_a_rejected_row(
    client: openai.OpenAI, ledger: Path, case: str
) -> None:
    before = len(read_rows(ledger))
    with pytest.raises(openai.APIStatusError) as failed:
        list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": case}],
                tools=TOOLS,
                stream=True,
            )
        )
    assert failed.value.status_code == 502
    row = last_row(ledger, before)
    assert (row.status, row.end_state) == (502, EndState.REJECTED)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("long line later", "a line longer than 1048576 bytes"),
        ("tool later", "'rm_rf', which the request did not offer"),
    ],
)
def test_a_breach_after_content_is_one_in_band_error_and_an_errored_row(
    gateway: ServerProcess, ledger: Path, case: str, why: str
) -> None:
    events = raw_stream(gateway, case, tools=TOOLS)
    first = json.loads(events[1].removeprefix(b"data: "))  # after the role chunk
    assert first["choices"][0]["delta"] == {"content": "hi"}
    last = json.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "upstream_protocol_error"
    assert why in last["error"]["message"]
    assert not any(b"[DONE]" in e or b'rm_rf"' in e for e in events[:-1])
    row = row_of(ledger, first["id"])
    assert (row.status, row.end_state) == (200, EndState.ERRORED)


def test_a_call_to_an_offered_tool_goes_through(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "tool offered"}],
            tools=TOOLS,
            stream=True,
        )
    )
    names = [
        call.function.name
        for chunk in chunks
        for choice in chunk.choices
        for call in choice.delta.tool_calls or ()
        if call.function is not None and call.function.name
    ]
    assert names == ["get_time"]


def test_a_usage_past_64_bits_is_billed_as_our_own_estimate(
    client: openai.OpenAI, gateway: ServerProcess, ledger: Path
) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "usage"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    # Tokens streamed, counted here; the prompt's, with no count the upstream
    # can be trusted for, estimated from its text.
    assert usage.completion_tokens == 2
    assert usage.prompt_tokens > 0
    row = row_of(ledger, chunks[0].id)
    assert row.end_state is EndState.FINISHED
    assert (row.prompt_tokens, row.completion_tokens) == (usage.prompt_tokens, 2)
    assert row.usage_estimated
    metrics = httpx.get(f"{gateway.base_url}/metrics", timeout=READ_TIMEOUT_S).text
    rejected = [
        line
        for line in metrics.splitlines()
        if line.startswith("sluicegate_upstream_usage_rejected_total{")
    ]
    assert len(rejected) == 1
    assert float(rejected[0].rsplit(" ", 1)[1]) >= 1


def test_prompt_tokens_past_what_the_prompt_holds_are_billed_as_our_estimate(
    client: openai.OpenAI, ledger: Path
) -> None:
    """The upstream tells no context window, and 10^12 prompt tokens for a
    prompt of a few bytes: past its bytes and the template's tokens, the
    usage is rejected as the other lies are; the client and the ledger get
    the gateway's estimate, marked estimated (docs/security.md)."""
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "prompt usage"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    assert 0 < usage.prompt_tokens <= 4096 + len("prompt usage") * 4, usage
    assert usage.completion_tokens == 2
    row = row_of(ledger, chunks[0].id)
    assert (row.prompt_tokens, row.completion_tokens) == (usage.prompt_tokens, 2)
    assert row.usage_estimated


def test_an_answer_with_no_content_and_no_usage_bills_the_estimate(
    client: openai.OpenAI, ledger: Path
) -> None:
    """As Messages does (docs/upstreams.md): the prompt's estimate, marked
    estimated, in chat's usage and the ledger; not 0."""
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "empty"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens > 0, usage
    assert usage.completion_tokens == 0
    row = row_of(ledger, chunks[0].id)
    assert row.prompt_tokens == usage.prompt_tokens
    assert row.usage_estimated
