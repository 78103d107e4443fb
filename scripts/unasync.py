"""Write the blocking client from the async one: ``aio.py`` -> ``sync.py`` and
``stream_aio.py`` -> ``stream_sync.py``.

Both live in ``src/sluicegate/client/``.

The async client is the only one written by hand. This script rewrites its text,
one line at a time, with the ordered rules in ``RULES`` (whole words only): the
``async`` and ``await`` keywords go, async types and httpx classes become their
blocking counterparts, and every async name loses its prefix (``astream_chat`` ->
``stream_chat``, ``__aiter__`` -> ``__iter__``); then a loop that only yields
each item becomes ``yield from``. Prose in docstrings goes through the same
rules, so it is written to read right both ways.

Usage::

    .venv/bin/python scripts/unasync.py           # rewrite client/sync.py
    .venv/bin/python scripts/unasync.py --check   # exit 1 if it is out of date

``scripts/check`` runs the second form.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "src/sluicegate/client"
# Each hand-written async module -> the blocking module generated from it.
PAIRS = (("aio.py", "sync.py"), ("stream_aio.py", "stream_sync.py"))
HEADER = (
    "# Generated from {source} by scripts/unasync.py: edit {source} and run the\n"
    "# script; scripts/check fails while this file differs from what it writes.\n"
)

RULES: tuple[tuple[str, str], ...] = (
    # Keywords.
    (r"\basync (def|for|with)\b", r"\1"),
    (r"\bawait ", ""),
    # Types: an async generator has no return type parameter, a generator has.
    (r"\bAsyncGenerator\[(\w+), None\]", r"Generator[\1, None, None]"),
    (r"\bAsyncGenerator\b", "Generator"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncIterable\b", "Iterable"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    # httpx's async classes and methods.
    (r"\bhttpx\.AsyncClient\b", "httpx.Client"),
    (r"\bhttpx\.AsyncBaseTransport\b", "httpx.BaseTransport"),
    (r"\baiter_(bytes|lines|raw|text)\b", r"iter_\1"),
    # Our own names.
    (r"\bsluicegate\.client\.stream_aio\b", "sluicegate.client.stream_sync"),
    (r"\bAsync(Client|Stream)\b", r"\1"),
    (r"\b__a(iter|next|enter|exit)__\b", r"__\1__"),
    (
        r"\ba(close|result|chat|complete|sleep"
        r"|stream_(?:chat|completion|responses|messages))\b",
        r"\1",
    ),
)
_COMPILED = tuple((re.compile(pattern), repl) for pattern, repl in RULES)

# An async generator cannot ``yield from``; a generator should.
_YIELD_EACH = re.compile(
    r"^(?P<indent>[ \t]*)for (?P<name>\w+) in (?P<items>.+):\n"
    r"(?P=indent)[ \t]+yield (?P=name)\n",
    re.MULTILINE,
)


def unasync_line(line: str) -> str:
    """``line`` with every rule of ``RULES`` applied in order."""
    for pattern, repl in _COMPILED:
        line = pattern.sub(repl, line)
    return line


def unasync(source: str, name: str = "aio.py") -> str:
    """The text of the blocking module for the async module's ``source`` (the
    text of the file ``name``)."""
    lines = source.splitlines(keepends=True)
    text = "".join(unasync_line(line) for line in lines)
    header = HEADER.format(source=name)
    return header + _YIELD_EACH.sub(r"\g<indent>yield from \g<items>\n", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare instead of writing; exit 1 on a difference",
    )
    args = parser.parse_args(argv)
    status = 0
    for source, target in PAIRS:
        wanted = unasync((CLIENT / source).read_text(encoding="utf-8"), source)
        status |= _write_or_check(CLIENT / target, wanted, check=args.check)
    return status


def _write_or_check(target: Path, wanted: str, *, check: bool) -> int:
    """Write ``wanted`` to ``target``, or with ``check`` compare them: 1 (and the
    diff on stderr) when they differ."""
    if not check:
        target.write_text(wanted, encoding="utf-8")
        return 0
    current = target.read_text(encoding="utf-8") if target.exists() else ""
    if current == wanted:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(keepends=True),
        wanted.splitlines(keepends=True),
        str(target.relative_to(ROOT)),
        "generated",
    )
    sys.stderr.writelines(diff)
    print(
        f"{target.relative_to(ROOT)} is out of date: run scripts/unasync.py",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
