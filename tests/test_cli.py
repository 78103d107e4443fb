"""``sluicegate serve`` with a setting out of range: one line and exit, no traceback."""

from __future__ import annotations

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
