"""The public names of sluicegate: sorted, importable, documented, and I/O-free."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import sluicegate

PACKAGES = ["sluicegate", "sluicegate.core", "sluicegate.client", "sluicegate.engines"]


def _isort_key(name: str) -> tuple[int, str]:
    # Constants, then classes, then functions and the rest (ruff's RUF022 order).
    group = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return group, name


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_every_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=_isort_key)
    assert len(set(exported)) == len(exported)
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == []


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_class_and_function_has_a_docstring(name: str) -> None:
    module = importlib.import_module(name)
    undocumented = [
        n
        for n in module.__all__
        if callable(obj := getattr(module, n))
        and not isinstance(obj, type(sys))
        and not (getattr(obj, "__doc__", None) or "").strip()
    ]
    assert undocumented == []


def test_top_level_exports_the_core_and_nothing_that_does_io() -> None:
    assert set(sluicegate.__all__) >= {"StopMatcher", "SSEDecoder", "StreamMachine"}
    io_modules = "{'asyncio', 'anyio', 'httpx', 'starlette', 'uvicorn'}"
    code = f"import sys, sluicegate; print(sorted({io_modules} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
