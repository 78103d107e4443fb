"""Smoke runs of the benchmarks with tiny sizes: they run and report; no timings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``bench/<name>.py`` as a module (registered, so pydantic resolves its names)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
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
