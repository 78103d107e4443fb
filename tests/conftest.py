"""Settings shared by the whole suite.

Hypothesis runs under the derandomized ``ci`` profile: the same examples on every
run and every machine, no deadline (CI machines are small and shared), and the
failing example's blob printed so it can be replayed. Tests that need fewer
examples set ``max_examples`` themselves.

Under pytest-xdist with no more workers than usable cores, each worker pins
itself (and so every server, llama.cpp thread and tool it starts) to cores of
its own: llama.cpp starts one thread per usable core, and two workers each
running two threads on the same two cores wait on each other at every decode
step.
"""

import os

from hypothesis import settings

from tests.postgres import postgres, postgres_url
from tests.redis_server import redis_server, redis_url

__all__ = ["postgres", "postgres_url", "redis_server", "redis_url"]

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200, print_blob=True
)
settings.load_profile("ci")


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
