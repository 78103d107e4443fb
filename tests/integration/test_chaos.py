"""A short chaos run (``bench/chaos.py``): the ledger and the clients agree.

Fifty concurrent streams against the scripted engine: readers, slow readers,
pausing readers, clients that disconnect at a random time, raw clients that
close right after sending, invalid requests; the engine fails a seeded share of
the sequences and stalls every one of them once. Afterwards every request has
exactly one ledger row, each row's end state is the client's classification, and
nothing is left running (active streams, queue, running sequences, KV cells).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .servers import load_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(90)
def test_fifty_misbehaving_streams_each_end_once_and_ledger_agrees_with_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chaos = load_bench("chaos", monkeypatch)

    report = chaos.chaos(50, seed=3, workdir=tmp_path)

    assert report.mismatches == [], report
    assert report.ledger_rows == 50
    assert report.idle_after == dict.fromkeys(chaos.IDLE_KEYS, 0.0)
    # The seed gives every kind of client and every end state a share.
    assert set(report.kinds) == set(chaos.KINDS), report.kinds
    assert set(report.client_states) == {
        "finished",
        "errored",
        "aborted",
        "rejected",
    }, report.client_states
