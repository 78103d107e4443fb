"""Smoke run of ``bench/gateway.py`` with tiny sizes: it runs, reports; no timings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.integration.servers import load_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"

ROW_KEYS = {
    "column",
    "n",
    "tokens_per_s",
    "events",
    "completion_tokens",
    "itl_added_ms",
    "schedule_lag_ms",
    "ttft_ms",
    "ttfb_ms",
    "loadavg_1m",
    "finished",
    "truncated",
    "timed_out",
    "errored",
    "rejected",
    "load_cpu_share",
    "hop_cpu_share",
    "hop_cpu_us_per_token",
    "upstream_cpu_us_per_token",
    "bytes_per_token",  # from the load of bench/streams.py
}


@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_gateway_bench_quick_run_reports_each_column_and_its_abort_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_bench("gateway", monkeypatch)
    out = tmp_path / "gateway.json"
    # LiteLLM's column only where its virtual environment was made.
    columns = ["direct", "sluicegate"]
    if (BENCH / ".litellm-venv" / "bin" / "litellm").exists():
        columns.append("litellm")

    argv = ["--quick", "--no-quiet", "--json", str(out), "--columns", *columns]
    assert module.main(argv) == 0

    report = json.loads(out.read_text())
    assert report["benchmark"] == "gateway"
    ran = [c for c in columns if c not in report["skipped"]]
    assert "direct" in ran
    assert {(row["column"], row["n"]) for row in report["rows"]} == {
        (column, 4) for column in ran
    }
    for row in report["rows"]:
        assert set(row) == ROW_KEYS
        assert set(row["itl_added_ms"]) == {"p50", "p99", "max"}
        assert row["finished"] + row["truncated"] + row["timed_out"] == 4
    probes = [(probe["column"], probe["mode"]) for probe in report["abort_probes"]]
    assert probes == [(c, mode) for c in ran for mode in ("stream", "json")]
    direct = report["rows"][0]
    assert direct["column"] == "direct"
    assert direct["finished"] == 4
    # sluicegate aborts what a client closes: the probes' baseline must see it.
    for probe in report["abort_probes"][:2]:
        assert probe["closed_early"] == probe["streams"] == 2
        assert probe["aborted_upstream"] == 2
        assert probe["running_after"] == 0
    assert {r["column"] for r in report["ratios"]} == set(ran) - {"direct"}
