"""The saturation rule of ``bench/streams.py`` (``bench/stream_procs.py``): the
same for both servers, over rows as the bench writes them."""

from __future__ import annotations

import socket
from types import ModuleType
from typing import Any

import pytest

from tests.integration.servers import load_bench


@pytest.fixture
def procs(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module: ModuleType = load_bench("stream_procs", monkeypatch, "stream_procs")
    return module


def _row(
    server: str, n: int, tokens_per_s: float, itl_p99: float, ttft_p99: float
) -> dict[str, Any]:
    return {
        "server": server,
        "n": n,
        "round": 0,
        "tokens_per_s": tokens_per_s,
        "itl_added_ms": {"p99": itl_p99},
        "ttft_ms": {"p99": ttft_p99},
        "timed_out": 0,
    }


def test_saturation_is_the_most_tokens_at_an_n_that_kept_both_bounds(
    procs: ModuleType,
) -> None:
    rows = [
        _row("one", 1000, 20_000, 5, 80),
        _row("one", 2000, 35_000, 20, 6_900),  # TTFT past the bound
        _row("two", 1000, 20_000, 5, 60),
        _row("two", 2000, 40_000, 14, 350),
        _row("two", 3000, 55_000, 60, 1_700),  # gaps past the bound
    ]
    best = {e["server"]: e for e in procs.saturation(rows, 25.0, 1000.0)}
    assert (best["one"]["n"], best["one"]["tokens_per_s"]) == (1000, 20_000)
    assert (best["two"]["n"], best["two"]["tokens_per_s"]) == (2000, 40_000)

    ratios = procs.worker_ratios(rows, 25.0, 1000.0, "one", "two")
    assert [(r["n"], r["ratio"]) for r in ratios] == [
        (1000, 1.0),
        (2000, pytest.approx(40 / 35)),
        ("saturation", 2.0),
    ]
    assert ratios[-1]["at_n"] == [1000, 2000]


def test_listen_queue_counts_the_connections_no_one_accepted(
    procs: ModuleType,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        assert procs.listen_queue(port) == 0
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            assert procs.listen_queue(port) == 3
            accepted, _ = listener.accept()
            accepted.close()
            assert procs.listen_queue(port) == 2
        finally:
            for client in clients:
                client.close()
