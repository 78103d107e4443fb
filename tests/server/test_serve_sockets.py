"""serve's listening sockets: several per process on one port, so that the
event loop accepts as many connections a turn."""

from __future__ import annotations

import argparse
import socket

import pytest

from sluicegate.server.app.workers import ACCEPT_SOCKETS, serve_sockets


def _args(
    port: int, listen_fd: int | None = None, accept_sockets: int = ACCEPT_SOCKETS
) -> argparse.Namespace:
    return argparse.Namespace(
        host="127.0.0.1", port=port, listen_fd=listen_fd, accept_sockets=accept_sockets
    )


def test_one_process_listens_on_several_sockets_of_one_port() -> None:
    sockets = serve_sockets(_args(0), 64)
    try:
        assert len(sockets) == ACCEPT_SOCKETS > 1
        ports = {s.getsockname()[1] for s in sockets}
        assert len(ports) == 1
        assert not any(s.get_inheritable() for s in sockets)
        # Each one listens: a connection to the port is queued on one of them.
        with socket.create_connection(("127.0.0.1", ports.pop()), timeout=5):
            pass
    finally:
        for s in sockets:
            s.close()


@pytest.mark.parametrize("count", [1, 3])
def test_accept_sockets_sets_how_many_sockets_one_process_listens_on(
    count: int,
) -> None:
    sockets = serve_sockets(_args(0, accept_sockets=count), 64)
    try:
        assert len(sockets) == count
        assert len({s.getsockname()[1] for s in sockets}) == 1
    finally:
        for s in sockets:
            s.close()


def test_a_worker_listens_on_the_socket_its_parent_passed() -> None:
    parent = socket.socket()
    parent.bind(("127.0.0.1", 0))
    parent.listen(8)
    try:
        [sock] = serve_sockets(_args(0, listen_fd=parent.fileno()), 64)
        assert sock.fileno() == parent.fileno()
        sock.detach()  # the parent's to close
    finally:
        parent.close()


def test_a_port_taken_without_reuse_is_refused_naming_the_address() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            serve_sockets(_args(port), 64)
    finally:
        taken.close()


def test_a_second_server_on_the_port_is_refused_not_let_share_it() -> None:
    first = serve_sockets(_args(0), 64)
    port = first[0].getsockname()[1]
    try:
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            serve_sockets(_args(port), 64)
    finally:
        for s in first:
            s.close()
