"""Settings shared by the whole suite.

Hypothesis runs under the derandomized ``ci`` profile: the same 100 examples a
test on every run and every machine (Hypothesis's default count), no deadline
(CI machines are small and shared), and the failing example's blob printed so
it can be replayed. Derandomized, more examples would only repeat the same
larger set on every run (200 cost the suite about a minute); new ground is
searched with ``HYPOTHESIS_PROFILE=explore``: random examples, 2,000 a test.
Tests that need another count set ``max_examples`` themselves.

Under pytest-xdist with no more workers than usable cores, each worker pins
itself (and so every server, llama.cpp thread and tool it starts) to cores of
its own: llama.cpp starts one thread per usable core, and two workers each
running two threads on the same two cores wait on each other at every decode
step.

Modules that run the real model go first, then the other integration modules,
then the rest: with each module on one worker (``--dist loadscope``), the long
modules start while there is still other work for the second worker, and the
run does not end on one worker running the longest module alone.

No test speaks TLS, yet every httpx client made with the default ``verify``
(ours, the ``openai`` and ``anthropic`` SDKs', ``httpx.get``) loads a whole CA
bundle, about 50 ms of CPU, and the suite makes thousands of them in its own
processes and the servers and tools it starts. ``SSL_CERT_FILE`` (which httpx
and OpenSSL read) names a file of one CA certificate instead, set here, over
any the environment gave, so that every process the run starts inherits it.
"""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from tests.postgres import postgres, postgres_url
from tests.redis_server import redis_server, redis_url

__all__ = ["postgres", "postgres_url", "redis_server", "redis_url"]


def _one_ca_file() -> None:
    """Set ``SSL_CERT_FILE`` to a file holding the first certificate of
    certifi's bundle (see above), whatever it was."""
    import certifi

    end = "-----END CERTIFICATE-----"
    bundle = Path(certifi.where()).read_text(encoding="ascii")
    first = bundle[: bundle.index(end) + len(end)] + "\n"
    path = Path(tempfile.gettempdir()) / "sluicegate-tests-one-ca.pem"
    if not path.exists() or path.read_text(encoding="ascii") != first:
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(first, encoding="ascii")
        partial.replace(path)
    os.environ["SSL_CERT_FILE"] = str(path)


_one_ca_file()

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=100, print_blob=True
)
settings.register_profile("explore", deadline=None, max_examples=2000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _pin_xdist_worker() -> None:
    """Give this xdist worker its share of the usable cores (see above)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    cores = sorted(os.sched_getaffinity(0))
    if not worker.startswith("gw") or not 0 < count <= len(cores):
        return
    index = int(worker[2:])
    share = len(cores) // count
    os.sched_setaffinity(0, cores[index * share : (index + 1) * share])


_pin_xdist_worker()


def _module_rank(items: list[pytest.Item]) -> int:
    """0 for a module with a real-model test, 1 for other integration, 2 else."""
    marks = {mark.name for item in items for mark in item.iter_markers()}
    if "llamacpp" in marks:
        return 0
    if marks & {"integration", "slow", "browser"}:
        return 1
    return 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order modules by ``_module_rank``, keeping collection order within a rank
    and within a module (see above)."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    ranked = sorted(modules.values(), key=_module_rank)
    items[:] = [item for module in ranked for item in module]
