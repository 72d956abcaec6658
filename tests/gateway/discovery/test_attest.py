"""Attestations: the (name, URL) pairs discovery may admit, in process and shared through a real redis-server."""

from __future__ import annotations

import pytest

from gateway.discovery.attest import Attestations
from tests.redis_server import HAVE_REDIS, RedisServer


async def test_only_the_registered_name_and_url_are_vouched_for() -> None:
    a = Attestations()
    await a.vouch("pod-a", "http://10.0.0.5:8100/")
    assert await a.vouched("pod-a", "http://10.0.0.5:8100")
    assert not await a.vouched("pod-a", "http://10.0.0.6:8100")  # the name alone proves nothing
    assert not await a.vouched("pod-b", "http://10.0.0.5:8100")  # nor the URL alone
    await a.revoke("pod-a")
    assert not await a.vouched("pod-a", "http://10.0.0.5:8100")


@pytest.mark.integration
@pytest.mark.skipif(not HAVE_REDIS, reason="redis-server not installed (make apt)")
async def test_replicas_share_registrations_through_redis_and_fail_closed() -> None:
    server = RedisServer().start()
    took, other = Attestations(server.url), Attestations(server.url)
    try:
        await took.vouch("pod-a", "http://10.0.0.5:8100")  # the replica the registration reached
        assert await other.vouched("pod-a", "http://10.0.0.5:8100")
        assert not await other.vouched("pod-a", "http://10.6.6.6:8100")
        await took.revoke("pod-a")
        assert not await other.vouched("pod-a", "http://10.0.0.5:8100")
        await took.vouch("pod-b", "http://10.0.0.7:8100")
        server.kill()
        assert not await other.vouched("pod-b", "http://10.0.0.7:8100")  # Redis away: not admitted
        assert await took.vouched("pod-b", "http://10.0.0.7:8100")  # its own registration still counts
    finally:
        await took.close()
        await other.close()
        server.kill()
