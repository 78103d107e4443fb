"""The ``data:`` payloads of a streamed response read line by line.

For tests that read a stream with ``httpx``'s ``iter_lines()`` and stop part
way (to kill a process or send a signal mid-stream): ``data_lines`` returns
each event's ``data:`` text, ``[DONE]`` included, until the stream ends or
``stop_after`` of them were read.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["data_lines"]


def data_lines(lines: Iterator[str], stop_after: int | None = None) -> list[str]:
    """The ``data:`` of each event (without the field name and the space after
    it) until ``lines`` ends or ``stop_after`` (>= 1) were read."""
    out: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            out.append(line[5:].strip())
            if stop_after is not None and len(out) >= stop_after:
                break
    return out
