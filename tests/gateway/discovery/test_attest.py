"""Attestations: the (name, URL) pairs discovery may admit, in process and shared through a real redis-server."""

from __future__ import annotations

import pytest
import redis

from gateway.discovery.attest import Attestations
from tests.redis_server import HAVE_REDIS, RedisServer

MAC_KEY = "attest-" + "0123456789abcdef" * 2


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
    took, other = Attestations(server.url, mac_key=MAC_KEY), Attestations(server.url, mac_key=MAC_KEY)
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


@pytest.mark.integration
@pytest.mark.skipif(not HAVE_REDIS, reason="redis-server not installed (make apt)")
async def test_an_entry_written_to_redis_without_the_gateways_key_admits_nothing() -> None:
    """Whoever can write Redis cannot admit a worker: an entry needs the MAC of the key only the
    gateways hold (SLUICE_ATTESTATION_KEY), and a gateway without that key shares nothing."""
    server = RedisServer().start()
    gateway = Attestations(server.url, mac_key=MAC_KEY)
    outsider = Attestations(server.url, mac_key="another-key-" + "f" * 20)
    keyless, replica = Attestations(server.url), Attestations(server.url, mac_key=MAC_KEY)
    raw = redis.Redis.from_url(server.url)
    url = "http://10.6.6.6:8100"
    try:
        raw.hset("sluice:attest", "pod-evil", url)  # the old, un-MAC'd format
        assert not await gateway.vouched("pod-evil", url)
        raw.hset("sluice:attest", "pod-evil", f"{url} {'0' * 64}")  # a MAC of the right shape
        assert not await gateway.vouched("pod-evil", url)
        await outsider.vouch("pod-evil", url)  # a MAC under another key
        assert not await gateway.vouched("pod-evil", url)
        await gateway.vouch("pod-a", "http://10.0.0.5:8100")
        entry = raw.hget("sluice:attest", "pod-a")
        raw.hset("sluice:attest", "pod-b", entry)  # a genuine MAC moved to another name
        assert not await gateway.vouched("pod-b", "http://10.0.0.5:8100")
        assert await replica.vouched("pod-a", "http://10.0.0.5:8100")  # the genuine entry admits
        await keyless.vouch("pod-c", "http://10.0.0.8:8100")  # no key: kept in process, never in Redis
        assert raw.hget("sluice:attest", "pod-c") is None and not await keyless.vouched("pod-a", "http://10.0.0.5:8100")
    finally:
        raw.close()
        for a in (gateway, outsider, keyless, replica):
            await a.close()
        server.kill()
