"""``sluicegate check`` in-process against a real server on the default model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.cli import main

from .live import serve

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp, pytest.mark.timeout(600)]


def test_check_passes_every_probe_on_the_default_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "verdicts.json"
    args = ["--n-ctx", "2048", "--parallel", "2"]
    with serve(args, tmp_path / "server.log") as url:
        argv = ["check", url, "--max-tokens", "12", "--prefill-tokens", "20"]
        code = main([*argv, "--json", str(out)])
    verdicts = {p["probe"]: p for p in json.loads(out.read_text())["probes"]}
    failed = {k: v["evidence"] for k, v in verdicts.items() if v["verdict"] == "fail"}
    assert failed == {}, capsys.readouterr().out
    assert code == 0
    unseen = {k for k, v in verdicts.items() if v["verdict"] == "not-observable"}
    # The default model does not reason: nothing to grade reasoning on; a
    # 20-token prompt is too quick a prefill to time, and the engine reports
    # no cached tokens of its own.
    expected = {"multibyte-text", "reasoning-framing", "time-to-headers"}
    assert unseen <= expected | {"cached-tokens"}, capsys.readouterr().out
