"""Real nginx for the integration tests: a generated main config, one process.

nginx comes from Debian (``scripts/install-system-deps``); it runs in the
foreground as one process (``daemon off``, ``master_process off``) with every
path in a temp dir, and serves the ``server`` blocks it is given.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

NGINX = Path("/usr/sbin/nginx")
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0

MAIN_CONFIG = """\
daemon off;
master_process off;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{
    worker_connections 64;
}}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
{includes}
}}
"""


@contextmanager
def running_nginx(
    root: Path, server_blocks: Sequence[str], health_urls: Sequence[str]
) -> Iterator[None]:
    """nginx serving ``server_blocks`` until the block exits.

    Each block goes in a file of its own, included in the ``http`` context. Waits
    until every URL of ``health_urls`` answers 200 through nginx.
    """
    if not NGINX.exists():
        pytest.fail(f"{NGINX} is missing: run scripts/install-system-deps")
    includes = []
    for number, block in enumerate(server_blocks):
        path = root / f"server-{number}.conf"
        path.write_text(block)
        includes.append(f"    include {path};")
    config = root / "nginx.conf"
    config.write_text(MAIN_CONFIG.format(root=root, includes="\n".join(includes)))
    with (root / "nginx.out").open("wb") as log:
        process = subprocess.Popen(
            [
                str(NGINX),
                "-p",
                str(root),
                "-e",
                str(root / "error.log"),
                "-c",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        for url in health_urls:
            wait_for_nginx(process, url, root)
        yield
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_nginx(process: subprocess.Popen[bytes], url: str, root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in (root / "nginx.out", root / "error.log")
        if p.exists()
    )
    pytest.fail(f"nginx did not proxy {url} within {START_TIMEOUT_S} s:\n{logs}")
