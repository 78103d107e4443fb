"""A chaos run of resumable streams: 200 clients, and the ledger agrees with each.

Two hundred chat streams against one ``sluicegate serve --resumable`` process
(scripted engine, an SQLite ledger, a grace period of ``GRACE_S``), all at
once, each drawn with a fixed seed to be:

- ``whole``: read to its end;
- ``resume``: cut at a random byte (inside an event or between two), then
  resumed with ``Last-Event-ID``, one to three times, some after a pause
  shorter than the grace period; a cut before the first whole event leaves no
  cursor, so the client sends the same ``POST`` with the same
  ``Idempotency-Key``, which attaches to the first log (a resume too);
- ``abandon``: cut and never resumed: the grace period must abort it;
- ``cancel``: ``POST .../cancel`` while it is read, then read to its end.

Afterwards every response has exactly one ledger row and every row is a
response a client made; each row's end state is the client's (an abandoned or
cancelled one ``aborted``), its status 200, its ``resumed`` the number of
resumes its client made; a stream whose client saw the end has the completion
tokens of its usage chunk, and its text, finish reason and usage are those of
an uninterrupted stream of the same request (the scripted engine is
deterministic). An abandoned stream's log ends in ``resume_grace_expired``, a
cancelled one in ``cancelled``, nothing is left running, and the server logged
no error.

Timing races kept out by construction: every sequence stalls ``STALL_S`` before
decode step ``STALL_STEP``, and every cut falls before that step's event, so a
client's last resume (at most three pauses of ``PAUSE_S``, and the reconnects)
starts while the producer still runs (a resume after its end is not counted),
and an abandoned stream's grace (plus one check interval) runs out long before
its generation could end. The grace is long beside the pauses because the
server is slow here: two hundred streams start at once (4,000 tokens before
the stall) in a server traced for coverage beside the rest of the suite, and
it read some resumes 3-5 s after they were sent (a 3 s grace, with 50 streams
at a time, expired under some of them).
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.client.assemble import StreamAssembler
from sluicegate.client.results import StreamResult
from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow, read_rows

from .servers import ServerProcess, StartServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = "/v1/chat/completions"
STREAMS = 200
SEED = 17
RATE = 50.0
"""Scripted tokens per second per sequence (one token: one event, ~310 bytes)."""
STALL_STEP, STALL_S = 20, 15.0
GRACE_S = 10.0
PAUSE_S = (0.05, 0.3)
"""A pause before a resume, when there is one: shorter than ``GRACE_S``."""
FIRST_CUT = (1, 2500)
"""Bytes read of the first response before a cut: within its first 8 events."""
LATER_CUT = (1, 900)
"""Bytes read of a resumed response before it is cut again (at most 3 events):
three cuts end before event 14, well before event ``STALL_STEP``."""
MAX_TOKENS = (30, 40, 50)
SCRIPT = "The quick brown fox streams tokens correctly, once upon a time. " * 4
"""What the engine says: more tokens (words, letters) than ``MAX_TOKENS``."""
PROMPTS = ("Hi", "Tell me a story about a fox.")
RUNS = STREAMS + len(PROMPTS) * len(MAX_TOKENS)
"""Streams in all: the plans and one reference per distinct request."""
KINDS = ("whole", "resume", "abandon", "cancel")
WEIGHTS = (3, 4, 2, 1)
GIVE_UP_S = 30.0
"""A liveness deadline for the ledger's last rows: not a threshold."""


@dataclass(frozen=True)
class Plan:
    """What one client does: ``cuts`` are the bytes it reads of each response
    before it drops the connection (the last response is read to its end,
    unless the plan is ``abandon``); ``pauses`` come before each resume."""

    index: int
    kind: str
    prompt: str
    max_tokens: int
    cuts: tuple[int, ...] = ()
    pauses: tuple[float, ...] = ()
    cancel_after: int = 0
    """``cancel``: the event sequence number after which it cancels."""

    def body(self) -> dict[str, Any]:
        return {
            "model": "scripted",
            "messages": [{"role": "user", "content": self.prompt}],
            "stream": True,
            "max_tokens": self.max_tokens,
            "stream_options": {"include_usage": True},
        }


@dataclass
class Outcome:
    """What a client saw: its last event id, its result, the resumes it made."""

    plan: Plan
    cursor: str | None
    result: StreamResult
    resumes: int = 0
    retries: int = 0
    """Resumes that were a repeated ``POST`` (no cursor yet)."""
    cancel_answer: Any = None

    @property
    def response_id(self) -> str | None:
        return self.cursor.rpartition(".")[0] if self.cursor else None


def plans(seed: int) -> list[Plan]:
    """``STREAMS`` plans drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    made = []
    for index in range(STREAMS):
        (kind,) = rng.choices(KINDS, WEIGHTS)
        cuts = []
        if kind == "resume":
            cuts = [rng.randint(*FIRST_CUT)]
            cuts += [rng.randint(*LATER_CUT) for _ in range(rng.randint(0, 2))]
        elif kind == "abandon":  # past the first event: the client knows the id
            cuts = [rng.randint(400, FIRST_CUT[1])]
        pauses = [rng.uniform(*PAUSE_S) if rng.random() < 0.5 else 0.0 for _ in cuts]
        made.append(
            Plan(
                index,
                kind,
                rng.choice(PROMPTS),
                rng.choice(MAX_TOKENS),
                tuple(cuts),
                tuple(pauses),
                rng.randint(1, 8),
            )
        )
    return made


def seq_of(cursor: str) -> int:
    return int(cursor.rpartition(".")[2])


async def read_body(
    response: httpx.Response, assembler: StreamAssembler, cut: int | None
) -> bool:
    """Feed the body to ``assembler``, only its first ``cut`` bytes when ``cut``
    is given; whether it was cut."""
    received = 0
    async for chunk in response.aiter_raw():
        if cut is not None and received + len(chunk) >= cut:
            assembler.feed(chunk[: cut - received], 0.0)
            return True
        received += len(chunk)
        assembler.feed(chunk, 0.0)
    return False


async def run_cuts(http: httpx.AsyncClient, plan: Plan) -> Outcome:
    """``whole``, ``resume`` and ``abandon``: each response cut as planned, each
    cut followed by a resume (or a repeated ``POST``) unless abandoned."""
    key = {"Idempotency-Key": uuid.uuid4().hex}
    post = http.build_request("POST", CHAT, json=plan.body(), headers=key)
    assembler, request = StreamAssembler(), post
    resumes = retries = 0
    for attempt in range(len(plan.cuts) + 1):
        cut = plan.cuts[attempt] if attempt < len(plan.cuts) else None
        response = await http.send(request, stream=True)
        try:
            assert response.status_code == 200, await response.aread()
            if request is post:
                assembler.head(200, response.headers, 0.0)
            was_cut = await read_body(response, assembler, cut)
        finally:
            await response.aclose()
        if not was_cut or plan.kind == "abandon":
            break
        await asyncio.sleep(plan.pauses[attempt])
        resumes += 1
        cursor = assembler.resume()
        if cursor is None:  # no whole event yet: the same POST attaches
            assembler, request, retries = StreamAssembler(), post, retries + 1
            continue
        path = f"{CHAT}/{cursor.rpartition('.')[0]}/events"
        request = http.build_request("GET", path, headers={"Last-Event-ID": cursor})
    result = assembler.flush(0.0, client_gone=plan.kind == "abandon")
    return Outcome(plan, assembler.last_event_id, result, resumes, retries)


async def run_cancel(http: httpx.AsyncClient, plan: Plan) -> Outcome:
    """Read, cancel after event ``cancel_after``, read on to the end."""
    assembler = StreamAssembler()
    answer = None
    async with http.stream("POST", CHAT, json=plan.body()) as response:
        assembler.head(response.status_code, response.headers, 0.0)
        async for chunk in response.aiter_raw():
            assembler.feed(chunk, 0.0)
            cursor = assembler.last_event_id
            if answer is None and cursor and seq_of(cursor) >= plan.cancel_after:
                path = f"{CHAT}/{cursor.rpartition('.')[0]}/cancel"
                answer = (await http.post(path)).json()
    result = assembler.flush(0.0)
    return Outcome(plan, assembler.last_event_id, result, cancel_answer=answer)


async def drive(base_url: str, made: Sequence[Plan]) -> list[Outcome]:
    """One uninterrupted reference stream per distinct request (index -1), then
    every plan, all at once."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    references = [
        Plan(-1, "whole", prompt, n) for prompt in PROMPTS for n in MAX_TOKENS
    ]

    async def one(http: httpx.AsyncClient, plan: Plan) -> Outcome:
        if plan.kind == "cancel":
            return await run_cancel(http, plan)
        return await run_cuts(http, plan)

    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=GIVE_UP_S
    ) as http:
        runs = [one(http, plan) for plan in [*references, *made]]
        return list(await asyncio.gather(*runs))


def wait_rows(ledger: Path, expected: int) -> list[LedgerRow]:
    """The ledger's ended rows once there are ``expected`` (or at the deadline)."""
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        rows = read_rows(ledger) if ledger.exists() else []
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def answer(result: StreamResult) -> tuple[object, ...]:
    return (result.end_state, result.text, result.finish_reason, result.usage)


def expected_state(outcome: Outcome) -> tuple[EndState, EndState]:
    """(the client's end state, the ledger's) that ``outcome``'s plan must give."""
    kind = outcome.plan.kind
    if kind == "abandon":
        return EndState.ABORTED, EndState.ABORTED
    if kind == "cancel":  # the client reads the error event the cancel wrote
        return EndState.ERRORED, EndState.ABORTED
    return EndState.FINISHED, EndState.FINISHED


def mismatches(outcome: Outcome, row: LedgerRow, reference: StreamResult) -> list[str]:
    """How ``row`` disagrees with what its client saw (``[]``: it agrees)."""
    plan, result = outcome.plan, outcome.result
    client_state, ledger_state = expected_state(outcome)
    seen = {
        "client end state": (result.end_state, client_state),
        "ledger end state": (row.end_state, ledger_state),
        "status": (row.status, 200),
        "resumed": (row.resumed, outcome.resumes),
    }
    if result.end_state is EndState.FINISHED:
        assert result.usage is not None
        seen["completion tokens"] = (
            row.completion_tokens,
            result.usage.completion_tokens,
        )
        seen["answer"] = (answer(result), answer(reference))
    if plan.kind == "cancel":
        error = result.error or {}
        seen["cancel"] = (
            outcome.cancel_answer,
            {"id": row.request_id, "cancelled": True},
        )
        seen["error code"] = (error.get("code"), "cancelled")
    return [
        f"{row.request_id} ({plan.kind} #{plan.index}): {name} {got!r} != {want!r}"
        for name, (got, want) in seen.items()
        if got != want
    ]


def compare(outcomes: Sequence[Outcome], rows: Sequence[LedgerRow]) -> list[str]:
    """Every way the ledger and the clients disagree (``[]`` when they agree)."""
    by_id = collections.defaultdict(list)
    for row in rows:
        by_id[row.request_id].append(row)
    problems = [
        f"{rid}: {len(found)} rows" for rid, found in by_id.items() if len(found) > 1
    ]
    references = {
        (o.plan.prompt, o.plan.max_tokens): o.result
        for o in outcomes
        if o.plan.index < 0
    }
    ids = {o.response_id for o in outcomes}
    problems += [f"{rid}: a row no client made" for rid in by_id if rid not in ids]
    for outcome in outcomes:
        found = by_id.get(outcome.response_id or "")
        if not found:
            problems.append(f"#{outcome.plan.index} ({outcome.plan.kind}): no row")
            continue
        reference = references[outcome.plan.prompt, outcome.plan.max_tokens]
        problems += mismatches(outcome, found[0], reference)
    return problems


def abandoned_tails(base_url: str, outcomes: Sequence[Outcome]) -> list[str]:
    """The abandoned streams whose log does not end in ``resume_grace_expired``
    (read after their rows were written: these reads count as no resume)."""
    wrong = []
    with httpx.Client(base_url=base_url, timeout=GIVE_UP_S) as http:
        for outcome in outcomes:
            if outcome.plan.kind != "abandon":
                continue
            assert outcome.cursor is not None
            path = f"{CHAT}/{outcome.response_id}/events"
            tail = http.get(path, headers={"Last-Event-ID": outcome.cursor}).text
            if '"code":"resume_grace_expired"' not in tail or "[DONE]" in tail:
                wrong.append(f"{outcome.response_id}: {tail[-300:]!r}")
    return wrong


@pytest.fixture
def chaos_server(
    start_server: StartServer, tmp_path: Path
) -> tuple[ServerProcess, Path]:
    """Every stream resumable, a short grace, every sequence stalled once."""
    script = tmp_path / "script.txt"
    script.write_text(SCRIPT)
    ledger = tmp_path / "ledger.sqlite"
    server = start_server(
        "resumable-chaos",
        *("--log-level", "warning", "--engine", "scripted", "--resumable"),
        *("--scripted-rate", str(RATE), "--scripted-text", str(script)),
        *("--scripted-max-running", str(RUNS), "--scripted-max-queued", "64"),
        *("--fault", f"stall:{STALL_STEP}:{STALL_S}", "--heartbeat-s", "0.5"),
        *("--resume-grace-s", str(GRACE_S), "--ledger", str(ledger)),
    )
    return server, ledger


@pytest.mark.timeout(90)
def test_two_hundred_cut_resumed_abandoned_and_cancelled_streams_agree_with_the_ledger(
    chaos_server: tuple[ServerProcess, Path],
) -> None:
    server, ledger = chaos_server
    made = plans(SEED)
    outcomes = asyncio.run(drive(server.base_url, made))
    rows = wait_rows(ledger, len(outcomes))

    for reference in (o for o in outcomes if o.plan.index < 0):
        result, n = reference.result, reference.plan.max_tokens
        assert SCRIPT.startswith(result.text), result.text
        assert result.usage is not None
        assert (result.finish_reason, result.usage.completion_tokens) == ("length", n)
    assert compare(outcomes, rows) == []
    assert len(rows) == len(outcomes) == RUNS
    assert abandoned_tails(server.base_url, outcomes) == []
    stats = httpx.get(f"{server.base_url}/engine/stats").json()
    assert (stats["running"], stats["queued"], stats["kv_cells_used"]) == (0, 0, 0)
    errors = [line for line in server.log_text().splitlines() if " ERROR " in line]
    assert errors == []  # misbehaving clients are no internal error
    # The seed gives every kind a share, one to three resumes, and a retry.
    assert set(collections.Counter(p.kind for p in made)) == set(KINDS)
    assert {o.resumes for o in outcomes if o.plan.kind == "resume"} == {1, 2, 3}
    assert any(o.retries for o in outcomes)
