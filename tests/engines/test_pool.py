"""UpstreamPool: routing, caps, the queue, ejection and health, on a manual clock."""

from __future__ import annotations

import pytest

from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.pool_values import (
    Outcome,
    PoolMember,
    PoolRefusal,
    RefusalReason,
)
from sluicegate.engines.upstream.pool import Lease, UpstreamPool


class Asker:
    """One request's answers."""

    def __init__(self) -> None:
        self.leases: list[Lease] = []
        self.refusals: list[PoolRefusal] = []

    def ask(self, pool: UpstreamPool, exclude: tuple[int, ...] = ()) -> Asker:
        self.ticket = pool.request(self.leases.append, self.refusals.append, exclude)
        return self

    @property
    def lease(self) -> Lease:
        (lease,) = self.leases
        return lease


def make(
    caps: tuple[int, ...] = (2, 2), **options: float
) -> tuple[UpstreamPool, ManualClock]:
    clock = ManualClock()
    members = [PoolMember(f"u{i}", cap) for i, cap in enumerate(caps)]
    return UpstreamPool(members, clock, **options), clock  # type: ignore[arg-type]


def test_the_member_with_fewest_streams_in_flight_is_chosen() -> None:
    pool, _ = make((3, 3))
    first = Asker().ask(pool).lease
    second = Asker().ask(pool).lease
    assert (first.member, second.member) == (0, 1)
    assert first.name == "u0"
    second.release(Outcome.SUCCESS)
    assert Asker().ask(pool).lease.member == 1
    assert pool.in_flight == 2


def test_ties_go_to_the_member_chosen_least_recently() -> None:
    pool, _ = make((3, 3))
    for expected in (0, 1, 0, 1):
        lease = Asker().ask(pool).lease
        assert lease.member == expected
        lease.release(Outcome.SUCCESS)


def test_past_every_cap_a_request_waits_then_gets_the_freed_member() -> None:
    pool, _ = make((1, 1))
    a, b = Asker().ask(pool), Asker().ask(pool)
    waiting = Asker().ask(pool)
    assert waiting.leases == []
    assert waiting.refusals == []
    assert pool.queued == 1
    b.lease.release(Outcome.SUCCESS)
    assert waiting.lease.member == 1
    assert pool.queued == 0
    assert a.lease.member == 0


def test_a_full_queue_refuses_at_once_and_a_long_wait_times_out() -> None:
    pool, clock = make((1,), max_queued=1, queue_timeout_s=5, retry_after_s=2)
    Asker().ask(pool)
    waiting = Asker().ask(pool)
    full = Asker().ask(pool)
    assert full.refusals == [PoolRefusal(RefusalReason.QUEUE_FULL, 2)]
    clock.advance(4.9)
    assert waiting.refusals == []
    clock.advance(0.2)
    assert waiting.refusals == [PoolRefusal(RefusalReason.QUEUE_TIMEOUT, 2)]
    assert pool.queued == 0


def test_a_cancelled_ticket_leaves_the_queue_and_hears_nothing() -> None:
    pool, clock = make((1,))
    holder = Asker().ask(pool)
    waiting = Asker().ask(pool)
    waiting.ticket.cancel()
    waiting.ticket.cancel()
    assert pool.queued == 0
    holder.lease.release(Outcome.SUCCESS)
    clock.advance(60)
    assert waiting.leases == []
    assert waiting.refusals == []
    holder.ticket.cancel()  # answered already: nothing to do


def test_failures_in_a_row_eject_a_member_for_its_cooldown() -> None:
    pool, clock = make((5, 5), eject_after_failures=2, cooldown_s=10)
    for _ in range(2):
        lease = Asker().ask(pool, exclude=(1,)).lease
        lease.release(Outcome.FAILURE)
        lease.release(Outcome.FAILURE)  # a second release is a no-op
    assert not pool.healthy(0)
    assert Asker().ask(pool).lease.member == 1
    counters = pool.counters()[0]
    assert counters.ejected
    assert not counters.healthy
    assert (counters.failures_total, counters.ejections_total) == (2, 1)
    refused = Asker().ask(pool, exclude=(1,))
    assert refused.refusals == [PoolRefusal(RefusalReason.NONE_ELIGIBLE, 10)]
    clock.advance(10)
    assert pool.healthy(0)
    assert Asker().ask(pool, exclude=(1,)).lease.member == 0


def test_a_success_or_a_refusal_clears_or_keeps_the_count() -> None:
    pool, _ = make((5,), eject_after_failures=2)
    Asker().ask(pool).lease.release(Outcome.FAILURE)
    Asker().ask(pool).lease.release(Outcome.SUCCESS)
    Asker().ask(pool).lease.release(Outcome.FAILURE)
    Asker().ask(pool).lease.release(Outcome.REFUSED)
    assert pool.healthy(0)
    Asker().ask(pool).lease.release(Outcome.FAILURE)
    assert not pool.healthy(0)
    assert pool.counters()[0].refusals_total == 1


def test_health_checks_take_members_out_and_back() -> None:
    pool, _ = make((1, 1))
    pool.report_health(0, False)
    assert Asker().ask(pool).lease.member == 1
    waiting = Asker().ask(pool)
    assert pool.queued == 1
    pool.report_health(0, True)
    assert waiting.lease.member == 0


def test_waiting_requests_are_refused_when_no_member_can_take_them() -> None:
    pool, _ = make((1,), retry_after_s=3)
    Asker().ask(pool)
    waiting = Asker().ask(pool)
    pool.report_health(0, False)
    assert waiting.refusals == [PoolRefusal(RefusalReason.NONE_ELIGIBLE, 3)]
    assert Asker().ask(pool).refusals[0].reason is RefusalReason.NONE_ELIGIBLE


def test_failover_excludes_the_members_tried() -> None:
    pool, _ = make((1, 1))
    assert Asker().ask(pool, exclude=(0,)).lease.member == 1
    assert Asker().ask(pool, exclude=(0, 1)).refusals[0].reason is (
        RefusalReason.NONE_ELIGIBLE
    )


def test_a_grant_that_releases_at_once_serves_the_next_in_line() -> None:
    pool, _ = make((1,))
    holder = Asker().ask(pool)
    served: list[int] = []

    def grant_and_release(lease: Lease) -> None:
        served.append(lease.member)
        lease.release(Outcome.SUCCESS)

    pool.request(grant_and_release, lambda refusal: None)
    last = Asker().ask(pool)
    holder.lease.release(Outcome.SUCCESS)
    assert served == [0]
    assert last.lease.member == 0


def test_ttft_is_counted_on_the_clock() -> None:
    pool, clock = make((1,))
    lease = Asker().ask(pool).lease
    clock.advance(0.25)
    lease.first_token()
    counters = pool.counters()[0]
    assert (counters.ttft_s_sum, counters.ttft_count) == (0.25, 1)
    assert counters.in_flight == 1
    assert counters.streams_total == 1
    assert pool.members == [PoolMember("u0", 1)]


@pytest.mark.parametrize(
    ("members", "options"),
    [
        ([], {}),
        ([PoolMember("a", 0)], {}),
        ([PoolMember("a")], {"max_queued": -1}),
        ([PoolMember("a")], {"eject_after_failures": 0}),
    ],
)
def test_bad_settings_are_refused(
    members: list[PoolMember], options: dict[str, int]
) -> None:
    with pytest.raises(ValueError, match="expected"):
        UpstreamPool(members, ManualClock(), **options)
