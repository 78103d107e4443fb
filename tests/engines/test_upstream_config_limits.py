"""An upstream's reader bounds from a config file's entry (``upstream_from_dict``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.core.upstream.limits import READER_LIMITS, ReaderLimits
from sluicegate.engines.upstream.config import upstream_from_dict
from sluicegate.engines.upstream.file import engines_from_file

URL = "http://127.0.0.1:9/v1"


def test_an_entry_without_bounds_gets_the_defaults() -> None:
    assert upstream_from_dict({"url": URL}, {}).limits == READER_LIMITS


def test_each_bound_is_read_from_the_entry() -> None:
    spec = {
        "url": URL,
        "max_line_bytes": 10,
        "max_event_bytes": 20,
        "max_deltas_per_chunk": 3,
        "max_tool_calls": 4,
        "max_response_bytes": 50,
    }
    assert upstream_from_dict(spec, {}).limits == ReaderLimits(10, 20, 3, 4, 50)


@pytest.mark.parametrize("value", [0, -1, 1.5, "8", True, None])
def test_a_bound_that_is_not_an_integer_of_at_least_one_is_refused(
    value: object,
) -> None:
    with pytest.raises(ValueError, match="expected max_tool_calls >= 1"):
        upstream_from_dict({"url": URL, "max_tool_calls": value}, {})


def test_a_toml_file_sets_the_bounds_of_its_upstream(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(
        f'[[models]]\nid = "m"\n[[models.upstreams]]\nurl = "{URL}"\n'
        "max_event_bytes = 4096\n",
        encoding="utf-8",
    )
    (engine,) = engines_from_file(path, {})
    assert engine._upstreams[0].limits.max_event_bytes == 4096
