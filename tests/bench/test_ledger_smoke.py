"""Smoke run of ``bench/ledger.py`` with tiny sizes: it runs, reports; no timings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_ledger_bench_reports_both_backends(
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = importlib.util.spec_from_file_location("bench_ledger", BENCH / "ledger.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
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
