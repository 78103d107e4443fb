"""Settings shared by the whole suite.

Hypothesis runs under the derandomized ``ci`` profile: the same examples on every
run and every machine, no deadline (CI machines are small and shared), and the
failing example's blob printed so it can be replayed. Tests that need fewer
examples set ``max_examples`` themselves.
"""

from hypothesis import settings

from tests.postgres import postgres, postgres_url
from tests.redis_server import redis_server, redis_url

__all__ = ["postgres", "postgres_url", "redis_server", "redis_url"]

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200, print_blob=True
)
settings.load_profile("ci")
