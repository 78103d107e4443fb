"""``sluicegate serve`` with a setting out of range: one line and exit, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.cli import main


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--cadence-ms", "5000", "cadence_s must be in [0, 1], got 5.0"),
        ("--heartbeat-s", "0", "heartbeat"),
        ("--resume-grace-s", "-1", "resume_grace_s >= 0"),
    ],
)
def test_a_setting_out_of_range_exits_with_one_line(
    flag: str, value: str, message: str
) -> None:
    argv = ["serve", "--engine", "scripted", "--no-ledger", flag, value]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    code = exit_.value.code
    assert isinstance(code, str), code
    assert code.startswith("sluicegate: ")
    assert message in code
    assert "\n" not in code


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_refused_before_anything_starts(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--engine", "scripted", "--no-ledger", "--port", port])
    assert exit_.value.code == 2  # argparse's usage error
    assert "--port" in capsys.readouterr().err


def test_model_prints_only_the_path_on_stdout() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate", "model"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    path = Path(done.stdout.removesuffix("\n"))
    assert "\n" not in str(path), repr(done.stdout)
    assert path.is_file()  # usable as $(sluicegate model)


def test_serve_with_no_flags_runs_the_engine_settings_doctor_reports() -> None:
    from sluicegate.cli import _parser
    from sluicegate.engines.llamacpp.config import EngineConfig, from_args

    assert from_args(_parser().parse_args(["serve"])) == EngineConfig()


def test_model_id_names_the_scripted_engine_too() -> None:
    """It was ignored: the scripted engine served "scripted" whatever was given."""
    from sluicegate.cli import _build_engine, _parser

    args = _parser().parse_args(["serve", "--engine", "scripted", "--model-id", "a/b"])
    assert _build_engine(args).model.id == "a/b"
    args = _parser().parse_args(["serve", "--engine", "scripted"])
    assert _build_engine(args).model.id == "scripted"


def test_prefix_reuse_without_the_full_sliding_window_cache_is_refused() -> None:
    from sluicegate.cli import _parser
    from sluicegate.engines.llamacpp.config import from_args

    args = _parser().parse_args(["serve", "--prefix-cache", "--no-swa-full"])
    with pytest.raises(SystemExit, match="--no-swa-full"):
        from_args(args)
