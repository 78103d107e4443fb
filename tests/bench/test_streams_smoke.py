"""Smoke run of ``bench/streams.py`` with tiny sizes: it runs, reports; no timings."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.servers import load_bench

ROW_KEYS = {
    "server",
    "n",
    "tokens_per_s",
    "events",
    "completion_tokens",
    "itl_added_ms",
    "schedule_lag_ms",
    "ttft_ms",
    "ttfb_ms",
    "finished",
    "truncated",
    "timed_out",
    "errored",
    "rejected",
    "load_cpu_share",
    "loadavg_1m",
    "server_cpu_share",
    "server_cpu_us_per_token",
    "server_rss_mib",
    "bytes_per_token",
    "measured_at_s",
    "round",
    "processes",
    "load_cpu_us_per_token",
    "miscounted",
    "load_client",
    "machine_cores",
    "cpu_budget",
    "throttled_s",
    "step_n",
    "listen_queue",
    "answered_s",
}


def _bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``bench/streams.py`` as a module (bench/ is scripts, not a package)."""
    module: ModuleType = load_bench("streams", monkeypatch)
    return module


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_streams_bench_quick_run_reports_every_server_at_every_n(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sse_starlette", reason="the baseline server needs it")
    module = _bench(monkeypatch)
    out = tmp_path / "streams.json"

    assert module.main(["--quick", "--json", str(out)]) == 0

    report = json.loads(out.read_text())
    assert report["benchmark"] == "streams"
    assert {"rate_tokens_per_s", "loadavg_before", "loadavg_after", "cpus"} <= set(
        report
    )
    runs = {(row["server"], row["n"]) for row in report["rows"]}
    servers = ("sluicegate", "sluicegate-plain", "baseline", "raw")
    client = "native" if shutil.which(os.environ.get("CC", "cc")) else "python"
    assert {row["load_client"] for row in report["rows"]} == {client}
    assert runs == {(s, n) for s in servers for n in (4, 16)}
    for row in report["rows"]:
        # The server's own histograms: sluicegate's only (/metrics).
        assert set(row) - {"server_side"} == ROW_KEYS
        if row["server"].startswith("sluicegate"):
            assert row["server_side"]["ttft_s"]["count"] >= row["finished"] > 0
            assert row["server_side"]["ttft_s"]["p99_le"] is not None
        else:
            assert "server_side" not in row
        assert row["answered_s"]["max"] is not None
        assert set(row["itl_added_ms"]) == {"p50", "p99", "max"}
        assert row["finished"] + row["truncated"] + row["timed_out"] > 0
        assert row["miscounted"] == 0
        assert [p["role"] for p in row["processes"]] == ["server"]
    assert {r["n"] for r in report["ratios"]} == {4, 16}
    assert {
        "tokens_per_s",
        "itl_added_p99",
        "cpu_us_per_token",
        "cpu_us_per_token_over_raw",
    } <= set(report["ratios"][0])
    for row in report["rows"]:
        if row["server"] == "raw":  # the floor serves whole streams too
            assert row["finished"] > 0
            assert row["truncated"] + row["errored"] + row["rejected"] == 0


@pytest.mark.timeout(90)
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_streams_bench_repeats_resumable_rounds_and_reports_their_median(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _bench(monkeypatch)
    out = tmp_path / "streams.json"
    argv = ["--quick", "--n", "4", "--servers", "sluicegate", "--resumable"]
    argv += ["--repeat", "2", "--load-client", "python"]  # the uvloop client

    assert module.main([*argv, "--json", str(out)]) == 0

    report = json.loads(out.read_text())
    assert {row["load_client"] for row in report["rows"]} == {"python"}
    runs = sorted((row["round"], row["n"], row["server"]) for row in report["rows"])
    servers = ("sluicegate", "sluicegate-resumable")
    assert runs == [(r, 4, s) for r in (0, 1) for s in servers]
    ratios = report["resumable"]
    assert sorted((r["n"], r["round"]) for r in ratios) == [(4, 0), (4, 1)]
    medians = {m["n"]: m for m in report["resumable_median"]}
    assert set(medians) == {4}
    for n, median in medians.items():
        assert (median["store"], median["rounds"]) == ("memory", 2)
        values = [r["cpu_us_per_token_on_over_off"] for r in ratios if r["n"] == n]
        assert median["cpu_us_per_token_on_over_off"] == pytest.approx(sum(values) / 2)
        assert (median["min"], median["max"]) == (min(values), max(values))


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_paired_rounds_measure_every_server_over_the_same_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _bench(monkeypatch)
    out = tmp_path / "streams.json"
    argv = ["--quick", "--n", "4", "--servers", "sluicegate", "--resumable"]
    argv += ["--paired"]

    assert module.main([*argv, "--json", str(out)]) == 0

    report = json.loads(out.read_text())
    assert report["paired"] is True
    runs = sorted((row["n"], row["server"]) for row in report["rows"])
    servers = ("sluicegate", "sluicegate-resumable")
    assert runs == [(4, s) for s in servers]
    for row in report["rows"]:
        assert set(row) == ROW_KEYS | {"paired_cpu_share", "server_side"}
        assert row["finished"] == row["n"]
        # the sum over the servers measured together, the same in each row
        together = [r for r in report["rows"] if r["n"] == row["n"]]
        assert row["paired_cpu_share"] == pytest.approx(
            sum(r["server_cpu_share"] for r in together)
        )
        # measured at the same time: each window overlaps the other's
        start, end = row["measured_at_s"]
        assert all(
            start < r["measured_at_s"][1] and r["measured_at_s"][0] < end
            for r in together
        )
    assert [r["n"] for r in report["resumable"]] == [4]
