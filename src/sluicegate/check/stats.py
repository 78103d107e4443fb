"""Pure load-test statistics over client ``StreamResult``s (used by ``bench``).

Units: seconds for latencies, tokens per second for throughput. Output tokens
are the server's ``usage.completion_tokens`` when it sent usage, else the
number of text events (an undercount when events coalesce several tokens).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from sluicegate.client.results import StreamResult

__all__ = ["Summary", "output_tokens", "percentile", "summarize"]

QUANTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between closest ranks.

    Returns:
        ``None`` for no values; the value itself for one.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Summary:
    """A load test's results.

    Attributes:
        requests: requests sent.
        wall_s: from the first request to the last end, in seconds.
        end_states: requests per end state (wire names).
        ttft_s: time to first token, ``{"p50", "p90", "p99", "mean"}``.
        itl_s: inter-token latency (gaps between text events), same keys.
        e2e_s: end-to-end latency, same keys.
        output_tokens: output tokens of all requests.
        output_tokens_per_s: ``output_tokens / wall_s``.
    """

    requests: int
    wall_s: float
    end_states: dict[str, int]
    ttft_s: dict[str, float | None]
    itl_s: dict[str, float | None]
    e2e_s: dict[str, float | None]
    output_tokens: int
    output_tokens_per_s: float

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data."""
        return {
            "requests": self.requests,
            "wall_s": self.wall_s,
            "end_states": self.end_states,
            "ttft_s": self.ttft_s,
            "itl_s": self.itl_s,
            "e2e_s": self.e2e_s,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens_per_s,
        }


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    out = {f"p{q}": percentile(values, q) for q in QUANTILES}
    out["mean"] = sum(values) / len(values) if values else None
    return out


def output_tokens(result: StreamResult) -> int:
    """Output tokens of one request (usage if sent, else text events)."""
    if result.usage is not None:
        return result.usage.completion_tokens
    return len(result.timing.token_times_s)


def summarize(results: Sequence[StreamResult], wall_s: float) -> Summary:
    """Summarize a load test.

    Args:
        results: one result per request, any end state.
        wall_s: the test's wall-clock duration in seconds (> 0).
    """
    ttft = [r.timing.first_token_s for r in results if r.timing.first_token_s]
    itl = [b - a for r in results for a, b in pairwise(r.timing.token_times_s)]
    e2e = [r.timing.end_s for r in results if r.end_state == "finished"]
    tokens = sum(output_tokens(r) for r in results)
    return Summary(
        requests=len(results),
        wall_s=wall_s,
        end_states=dict(Counter(r.end_state.value for r in results)),
        ttft_s=_spread(ttft),
        itl_s=_spread(itl),
        e2e_s=_spread(e2e),
        output_tokens=tokens,
        output_tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
    )
