"""A smoke run of ``bench/engine_process.py kill`` with two streams: it kills
the engine process, and its JSON says how each stream and ledger row ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.test_bench_smoke import load


@pytest.mark.timeout(120)
def test_engine_process_kill_bench_reports_streams_and_closed_ledger_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "kill.json"
    bench = load("engine_process", monkeypatch)
    assert bench.main(["kill", "--streams", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["benchmark"], report["mode"], report["streams"]) == (
        "engine_process",
        "kill",
        2,
    )
    assert len(report["load_at_start"]) == len(report["load_after"]) == 3
    assert report["one_engine_crashed_no_done"] == 2
    # The new engine started after the kill and answered after it started.
    assert 0 < report["engine_started_after_kill_s"] < report["first_200_after_kill_s"]
    assert report["engine_first_start_s"] > 0
    assert report["ledger_rows"] == {
        "closed": 2,
        "errored": 2,
        "errored_with_streamed_tokens": 2,
        "missing": 0,
    }
