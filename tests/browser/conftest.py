"""A real Chromium (Debian's ``/usr/bin/chromium``) driven by Playwright, and the
servers the playground is tried on.

Playwright's own browser download is never used: the browser is the system one,
launched headless with a fresh profile, no network features of its own (no sync,
no component updates, no QUIC). One browser serves a whole module; each test
opens its own page.

A test that fails gets the tail of each server's log in its report.
"""

from __future__ import annotations

import shutil
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Playwright, sync_playwright

from sluicegate import testing
from sluicegate.testing import ServerProcess, free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 4000

_running: list[ServerProcess] = []


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-system-deps")
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(
    playwright: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrowserContext]:
    """Chromium on a fresh user-data folder (its one context), closed after the
    module; each test opens its pages in it."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    context = playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=str(CHROMIUM),
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": 1100, "height": 900},
    )
    yield context
    context.close()
    shutil.rmtree(profile, ignore_errors=True)


def start_server(name: str, log_dir: Path, *args: str) -> ServerProcess:
    """``sluicegate serve *args`` on a free port, healthy, or the test fails."""
    port = free_port()
    server = ServerProcess(
        testing.serve_command(port, "--log-level", "warning", *args),
        port,
        log_path=log_dir / f"{name}-{port}.log",
        name=name,
    )
    _running.append(server)
    try:
        server.wait_ready("/health", timeout_s=READY_TIMEOUT_S)
    except testing.ServerNotReady as exc:
        pytest.fail(str(exc), pytrace=False)
    return server


def stop_server(server: ServerProcess) -> None:
    server.stop()
    _running.remove(server)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for server in _running:
            tail = server.log_text()[-LOG_TAIL_CHARS:]
            report.sections.append((f"{server.name} server log (tail)", tail))
    return report
