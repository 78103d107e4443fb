"""The hostile-upstream tests' processes and their ``harness`` fixture.

A ``Harness`` is one gateway process (``sluicegate serve --upstreams FILE
--ledger FILE``) serving two models: ``hostile`` from the fake upstream of
``hostile_upstream.py`` (its own process, with an API key the gateway must
never let out) and ``scripted`` from a paced scripted sluicegate, the ordinary
traffic whose liveness ``liveness_probe.py`` (a third process) measures while
an attack runs. ``Harness.attack`` runs one attack under that measurement
(``hostile.Measured``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate import testing
from sluicegate.server.ledger.ledger import read_rows

from .hostile import (
    BRIEF_FIRST_TOKEN_LIMIT_S,
    COUNT_LIMIT_S,
    DISCOVERY_GIVE_UP_S,
    FIRST_TOKEN_LIMIT_S,
    HOSTILE,
    HOSTILE_BRIEF,
    KEY_ENV,
    ROOT,
    SCRIPTED,
    Measured,
    open_rows,
    peak_rss,
    reset_peak_rss,
)
from .servers import ServerProcess, StartServer, free_port

SETTLE_S = 0.15
"""The probe runs this long after an attack's last byte, before its window closes."""
WARMUP_S = 0.25
"""The probe runs this long before an attack starts (its first stream is under way)."""
ROWS_WITHIN_S = 10.0
"""Every row of a window must be closed in the ledger file this soon after it."""


# -- the processes -------------------------------------------------------------------


class Probe:
    """``liveness_probe.py`` in its own process, on the gateway's ``scripted`` model."""

    def __init__(self, url: str, log_path: Path) -> None:
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.liveness_probe", url, SCRIPTED],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=ROOT,
            text=True,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()
        assert ready == "ready\n", f"the probe did not start: {ready!r}"

    def start(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("start\n")
        self.process.stdin.flush()

    def stop(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the probe died: {self.process.poll()}"
        window: dict[str, Any] = json.loads(line)
        return window

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


def upstreams_toml(hostile_url: str, scripted_url: str) -> str:
    """The gateway's ``--upstreams`` file: the three models.

    The hostile models' pools never eject their one member (each attack is a
    failure, and the next attack must reach it) and run no health checks
    (they would be answered by the attack-free route anyway); their time limits
    are a safety net well past what a test waits for, but for the brief
    model's time to first token.
    """
    hostile = [
        _hostile_model(name, hostile_url, first_token_s)
        for name, first_token_s in (
            (HOSTILE, FIRST_TOKEN_LIMIT_S),
            (HOSTILE_BRIEF, BRIEF_FIRST_TOKEN_LIMIT_S),
        )
    ]
    return (
        "".join(hostile)
        + f"""
[[models]]
id = "{SCRIPTED}"
health_interval_s = 0

[[models.upstreams]]
url = "{scripted_url}"
model = "{SCRIPTED}"
"""
    )


def _hostile_model(name: str, url: str, first_token_s: float) -> str:
    return f"""
[[models]]
id = "{name}"
context_length = 8192
eject_after_failures = 1000000
cooldown_s = 0
health_interval_s = 0

[[models.upstreams]]
url = "{url}"
model = "{HOSTILE}"
api_key_env = "{KEY_ENV}"
first_token_timeout_s = {first_token_s}
count_timeout_s = {COUNT_LIMIT_S}
idle_timeout_s = 15
total_timeout_s = 60
"""


@dataclass
class Harness:
    """The gateway, the fake upstream's URLs, the probe, the key; the figures."""

    gateway: ServerProcess
    ledger: Path
    hostile_base: str
    """The fake upstream's origin, ``http://127.0.0.1:N``."""
    probe: Probe
    key: str
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def client(self, timeout_s: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.gateway.base_url, timeout=timeout_s)

    def upstream_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(
            f"{self.hostile_base}/_control/stats", timeout=10
        ).json()
        return stats

    @contextlib.contextmanager
    def attack(self, name: str, expected_rows: int = 1) -> Iterator[Measured]:
        """Measure the block: liveness, peak RSS, then wait for its rows to close
        and check that the key is in no log line, ledger byte or metric.

        ``expected_rows``: how many ``hostile`` requests the block sends.
        """
        pid = self.gateway.pid
        rss_before = reset_peak_rss(pid)
        started_at = time.time()
        self.probe.start()
        time.sleep(WARMUP_S)
        measured = Measured(name, {}, rss_before, 0)
        try:
            yield measured
        finally:
            time.sleep(SETTLE_S)
            measured.window = self.probe.stop()
            measured.peak_rss = peak_rss(pid)
        self.figures[name] = measured.figures
        self._wait_for_rows(measured, started_at, expected_rows)
        self.assert_no_secret()

    def _wait_for_rows(
        self, measured: Measured, started_at: float, expected_rows: int
    ) -> None:
        probes = len(measured.window["streams"])
        deadline = time.monotonic() + ROWS_WITHIN_S
        while True:
            rows = [r for r in read_rows(self.ledger) if r.received_at >= started_at]
            measured.rows = [r for r in rows if r.model != SCRIPTED]
            measured.probe_rows = [r for r in rows if r.model == SCRIPTED]
            closed = (
                len(measured.rows) >= expected_rows
                and len(measured.probe_rows) >= probes
            )
            if (closed and open_rows(self.ledger) == 0) or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def assert_no_secret(self, *texts: str | bytes) -> None:
        """The key, or any 12 characters of it, is in none of ``texts``, the
        gateway's log, its ledger file or its metrics."""
        metrics = httpx.get(f"{self.gateway.base_url}/metrics", timeout=10).text
        ledger_bytes = b"".join(
            p.read_bytes()
            for p in self.ledger.parent.glob(self.ledger.name + "*")
            if p.is_file()
        )
        places = {
            "log": self.gateway.log_text(),
            "metrics": metrics,
            "ledger": ledger_bytes.decode("latin-1"),
        }
        for number, text in enumerate(texts):
            places[f"client text {number}"] = (
                text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            )
        secret = self.key.removeprefix("sk-")
        windows = {secret[i : i + 12] for i in range(len(secret) - 11)}
        for place, text in places.items():
            leaked = [w for w in windows if w in text]
            assert not leaked, (
                f"the upstream's key leaked into the {place}: {text[:2000]}"
            )


@pytest.fixture(scope="module")
def harness(
    start_server: StartServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    folder = tmp_path_factory.mktemp("hostile")
    port, other_port = free_port(), free_port()
    command = [
        *(sys.executable, "-m", "tests.integration.hostile_upstream"),
        *("--port", str(port), "--other-port", str(other_port)),
    ]
    with testing.ServerProcess(
        command, port, log_path=folder / "hostile.log", name="hostile", cwd=ROOT
    ) as upstream:
        upstream.wait_ready("/v1/models")
        scripted = start_server(
            "scripted-paced",
            *("--engine", "scripted", "--scripted-rate", "100"),
            *("--no-ledger", "--log-level", "warning"),
        )
        config = folder / "upstreams.toml"
        config.write_text(
            upstreams_toml(f"{upstream.base_url}/v1", f"{scripted.base_url}/v1")
        )
        key = "sk-" + secrets.token_urlsafe(32)
        ledger = folder / "ledger.sqlite"
        with pytest.MonkeyPatch.context() as env:
            env.setenv(KEY_ENV, key)
            gateway = start_server(
                "gateway-hostile",
                *("--upstreams", str(config), "--ledger", str(ledger)),
                *("--log-level", "info"),
            )
        probe = Probe(gateway.base_url, folder / "probe.log")
        harness = Harness(gateway, ledger, upstream.base_url, probe, key)
        try:
            yield harness
        finally:
            probe.close()
            write_figures(harness.figures)


def write_figures(figures: Mapping[str, Any]) -> None:
    """Write the liveness figures to ``$SLUICEGATE_LIVENESS_REPORT`` when it is set."""
    target = os.environ.get("SLUICEGATE_LIVENESS_REPORT")
    if target:
        Path(target).write_text(json.dumps(figures, indent=2) + "\n")


class DrippingStartUp:
    """``sluicegate serve --upstream URL`` on the fake upstream's dripped model
    list (one byte a second), run to its end in the background.

    Start-up gives up only at its discovery deadline, and until then it only
    waits, so it runs while the module's attacks do instead of after them.
    """

    def __init__(self, hostile_base: str) -> None:
        self.url = f"{hostile_base}/drip/v1"
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--upstream", self.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.stderr = ""
        self.elapsed_s: float | None = None
        """Seconds from start to exit; ``None`` while it runs."""
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        _, self.stderr = self.process.communicate()
        self.elapsed_s = time.monotonic() - self.started

    def wait(self, give_up_s: float) -> None:
        """Wait until it exited, or ``give_up_s`` seconds after its start."""
        self._waiter.join(max(0.0, self.started + give_up_s - time.monotonic()))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self._waiter.join(10)


@pytest.fixture(scope="module")
def dripping_start_up(harness: Harness) -> Iterator[DrippingStartUp]:
    """A ``DrippingStartUp``, returned once its discovery has begun (its own
    start-up work done, so that it does not share the first attack's window)."""
    start_up = DrippingStartUp(harness.hostile_base)
    try:
        while (
            harness.upstream_stats()["drips"] == 0
            and start_up.process.poll() is None
            and time.monotonic() < start_up.started + DISCOVERY_GIVE_UP_S
        ):
            time.sleep(0.05)
        yield start_up
    finally:
        start_up.close()
