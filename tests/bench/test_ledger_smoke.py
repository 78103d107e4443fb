"""Smoke run of ``bench/ledger.py`` with tiny sizes: it runs, reports; no timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.servers import load_bench


def test_ledger_bench_reports_both_backends(
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = load_bench("ledger", monkeypatch)
    out = tmp_path / "ledger.json"
    argv = ["--requests", "50", "--runs", "1", "--url", postgres_url, "--out", str(out)]
    assert module.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["statements"] == 100
    assert [b["backend"] for b in result["backends"]] == [
        "SQLite (WAL file)",
        "PostgreSQL (psycopg)",
    ]
    assert all(b["rows_per_s"] > 0 for b in result["backends"])
    assert "rows/s" in capsys.readouterr().out
