"""Smoke runs of the benchmarks with tiny sizes: they run and report; no timings."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.servers import load_bench


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``bench/<name>.py`` as a module (registered, so pydantic resolves its names)."""
    module: ModuleType = load_bench(name, monkeypatch)
    return module


def test_core_bench_quick_run_writes_every_path_for_one_and_four_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("llama_cpp", reason="Gemma's vocabulary is read with it")
    out = tmp_path / "core.json"
    assert load("core", monkeypatch).main(["--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "core"
    assert report["unit"] == "cpu_us_per_token"
    assert {"stops", "runs", "reps", "python", "machine", "rows"} <= report.keys()
    paths = {(row["path"], row["n"]) for row in report["rows"]}
    names = ("core", "core decode", "core frame", "baseline")
    assert paths == {(name, n) for name in names for n in (1, 4)}
    for row in report["rows"]:
        assert set(row) == {
            "path",
            "n",
            "tokens_per_stream",
            "us_per_token",
            "ratio_vs_baseline",
        }
        assert row["tokens_per_stream"] > 0
        assert row["us_per_token"] > 0


def test_calls_bench_counts_calls_per_token_here_and_at_a_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "calls.json"
    argv = ["--streams", "2", "--tokens", "5", "--against", "HEAD", "--json", str(out)]
    assert load("calls", monkeypatch).main(argv) == 0
    report = json.loads(out.read_text())
    assert (report["benchmark"], report["streams"], report["tokens"]) == ("calls", 2, 5)
    here, there = report["runs"].values()
    for run in (here, there):
        assert run["calls_per_token"] > 5  # a token costs a few calls at least
        assert run["writes_per_stream"] >= 5  # each token written
        assert any(name.startswith("sluicegate/") for name in run["functions"])
