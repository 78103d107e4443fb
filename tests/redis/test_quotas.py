"""Shared quotas in a real Redis: two ``Admission``s (two replicas) on one budget."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sluicegate.server.admission.keys import Admission, ApiKey
from sluicegate.server.admission.quotas import Quota
from sluicegate.server.http.errors import OverQuota, Unavailable
from sluicegate.server.redis.client import connect
from sluicegate.server.redis.quotas import RedisQuotas
from sluicegate.testing import free_port

pytestmark = pytest.mark.anyio

KEY = ApiKey("sk-test", key_id="alice")


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[tuple[Admission, Admission]]:
    """Two admissions sharing one Redis: 2 requests/min, 100 tokens/min."""
    quota = Quota(requests_per_minute=2, tokens_per_minute=100)
    clients = [connect(redis_url), connect(redis_url)]
    shared = [RedisQuotas(client, quota) for client in clients]
    yield (
        Admission([KEY], quota, shared=shared[0]),
        Admission([KEY], quota, shared=shared[1]),
    )
    for quotas, client in zip(shared, clients, strict=True):
        await quotas.aclose()
        await client.aclose()


async def test_the_second_replica_refuses_once_the_first_spent_the_budget(replicas):
    first, second = replicas
    await first.admit_async(KEY, "m", 10)
    await first.admit_async(KEY, "m", 10)
    with pytest.raises(OverQuota) as refused:
        await second.admit_async(KEY, "m", 10)
    assert refused.value.retry_after_s == 30  # one request refills in 60 s / 2
    assert not refused.value.tokens_only


async def test_a_token_refusal_names_its_wait_and_takes_nothing(replicas):
    first, second = replicas
    await first.admit_async(KEY, "m", 70)
    with pytest.raises(OverQuota) as refused:
        await second.admit_async(KEY, "m", 40)
    assert refused.value.tokens_only
    assert refused.value.retry_after_s == 6  # 10 tokens at 100/60 per second
    await second.admit_async(KEY, "m", 30)  # the refusal took no request


async def test_probe_takes_nothing(replicas):
    first, second = replicas
    for _ in range(5):
        await first.probe(KEY, "m", 100)
    await second.admit_async(KEY, "m", 100)
    with pytest.raises(OverQuota):
        await first.probe(KEY, "m", 1)


async def test_refund_and_release_give_back_on_the_other_replica(replicas):
    first, second = replicas
    (await first.admit_async(KEY, "m", 100)).refund()
    await _settled(first)
    grant = await second.admit_async(KEY, "m", 100)
    grant.release(40)  # 60 unused
    await _settled(second)
    await first.admit_async(KEY, "m", 60)
    with pytest.raises(OverQuota) as refused:  # both requests are spent now
        await first.admit_async(KEY, "m", 1)
    assert not refused.value.tokens_only


async def test_a_give_back_never_fills_a_bucket_past_its_capacity(replicas):
    first, _ = replicas
    grant = await first.admit_async(KEY, "m", 1)
    grant.refund()
    grant.refund()  # a second settlement does nothing
    await _settled(first)
    first._shared.give("alice", 5, 500)
    await _settled(first)
    await first.admit_async(KEY, "m", 100)
    with pytest.raises(OverQuota):
        await first.admit_async(KEY, "m", 1)


async def test_without_a_limit_the_shared_store_is_never_asked():
    dead = connect(f"redis://127.0.0.1:{free_port()}/0")
    admission = Admission([KEY], Quota(), shared=RedisQuotas(dead, Quota()))
    await admission.admit_async(KEY, "m", 10)
    await admission.probe(KEY, "m", 10)
    await dead.aclose()


async def test_redis_down_refuses_with_503_and_retry_after():
    quota = Quota(requests_per_minute=5)
    dead = connect(f"redis://127.0.0.1:{free_port()}/0")
    quotas = RedisQuotas(dead, quota, retry_after_s=3)
    admission = Admission([KEY], quota, shared=quotas)
    with pytest.raises(Unavailable) as refused:
        await admission.admit_async(KEY, "m", 10)
    assert refused.value.code == "quota_store_unavailable"
    assert refused.value.retry_after_s == 3
    with pytest.raises(Unavailable):
        await admission.probe(KEY, "m", 10)
    quotas.give("alice", 1, 10)  # lost, logged; never raises
    await quotas.aclose()
    await dead.aclose()


async def _settled(admission: Admission) -> None:
    """Wait for the background give-backs of ``admission``'s shared buckets."""
    shared = admission._shared
    assert isinstance(shared, RedisQuotas)
    await shared.aclose()
    await asyncio.sleep(0)
