"""Real servers for the integration tests: uvicorn subprocesses on free ports.

One llama.cpp server on the default model (Gemma 3 270M, assembled beforehand by
``sluicegate model``) serves the whole session; the tests send one request at a
time, so after each test the engine must be idle again. Servers with a scripted
engine or an API key start only for the tests that need them.

A failing test gets the tail of every running server's log in its report.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Generator, Iterator

import httpx
import openai
import pytest

pytest.register_assert_rewrite(f"{__package__}.wire")

from sluicegate.testing import STOP_TIMEOUT_S  # noqa: E402

from .servers import N_CTX, PARALLEL, ServerProcess, StartServer  # noqa: E402
from .wire import engine_stats, wait_until  # noqa: E402

IDLE_TIMEOUT_S = 30.0
"""A liveness deadline: a step in flight ends in tens of ms on 2 idle cores, but
may take seconds where the cores are shared with other work."""
LOG_TAIL_CHARS = 6000

_running: list[ServerProcess] = []


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServer]:
    """``start_server(name, *args)``: a healthy server, stopped at session end."""
    started: list[ServerProcess] = []
    log_dir = tmp_path_factory.mktemp("servers")

    def start(name: str, *extra_args: str) -> ServerProcess:
        server = ServerProcess(name, extra_args, log_dir)
        started.append(server)
        _running.append(server)
        server.wait_healthy()
        return server

    yield start
    # Every server is told to stop first, then each is waited for: their
    # shutdowns run at once instead of one after another. (``stop`` would send
    # a second SIGTERM, which tells a server to skip its graceful shutdown.)
    for server in started:
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGTERM)
    for server in reversed(started):
        try:
            server.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
        status = server.process.returncode
        _running.remove(server)
        # 0 or -SIGTERM is a clean stop; anything else deserves a look.
        if status not in (0, -signal.SIGTERM):
            print(f"\n{server.name} server exited with {status}:\n{server.log_text()}")


@pytest.fixture(scope="session")
def llama_server(start_server: StartServer) -> ServerProcess:
    """The default model through llama.cpp, ``--n-ctx 2048 --parallel 2``."""
    return start_server(
        "llamacpp",
        "--log-level",
        "warning",
        "--engine",
        "llamacpp",
        "--n-ctx",
        str(N_CTX),
        "--parallel",
        str(PARALLEL),
    )


@pytest.fixture(scope="session")
def base_url(llama_server: ServerProcess) -> str:
    return llama_server.base_url


@pytest.fixture(scope="session")
def http(base_url: str) -> Iterator[httpx.Client]:
    """Raw HTTP to the llama.cpp server (httpx sends ``Accept-Encoding: gzip``)."""
    with httpx.Client(base_url=base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="session")
def sdk(base_url: str) -> Iterator[openai.OpenAI]:
    """The official openai client, pointed at the llama.cpp server, no retries."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    yield client
    client.close()


@pytest.fixture(scope="session")
def model_id(http: httpx.Client) -> str:
    """The id ``/v1/models`` gives the served model."""
    response = http.get("/v1/models")
    assert response.status_code == 200, response.text
    model: str = response.json()["data"][0]["id"]
    return model


@pytest.fixture(autouse=True)
def engine_is_idle_after_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the llama.cpp server nothing runs and no KV cell is held.

    Every stream a test opened must have ended (finished, errored or aborted), so a
    request still running afterwards is a leak, whatever the test itself checked.
    """
    if "llama_server" not in request.fixturenames:
        yield
        return
    server: ServerProcess = request.getfixturevalue("llama_server")
    yield
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        idle, _ = wait_until(
            client,
            lambda s: (
                s["running"] == 0 and s["queued"] == 0 and s["kv_cells_used"] == 0
            ),
            started_s=time.monotonic(),
            give_up_s=IDLE_TIMEOUT_S,
            interval_s=0.05,
        )
        assert idle is not None, f"engine busy after the test: {engine_stats(client)}"


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
