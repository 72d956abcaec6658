"""Fair queuing across gateway replicas (and `--frontends` processes) through Redis.

Each process keeps its own virtual token counters (gateway.llm.admission.fair); alone, a tenant
that floods one replica would look fresh on another. With `--redis-url` every process adds, every
`SYNC_S`, the tokens it served each tenant since the last round to a Redis hash per model
(`sluice:fair:<model>`, tenant -> tokens served by all), and reads back the total: what the others
served that tenant meanwhile is charged to the tenant's counter here too. So a tenant's counter
counts its service everywhere, up to one round late: approximately fair across replicas.

Redis being away costs only that: the counters go on locally, the unsent tokens wait for the next
round, and the loss is logged once per outage. The loop runs under `engines.supervision`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from redis.exceptions import RedisError

from engines.supervision import BackgroundTask
from gateway.llm.admission.fair import FairQueue

# The fair queue of each model this process serves, now (models come and go).
Queues = Callable[[], Mapping[str, FairQueue]]

log = logging.getLogger("sluice.admission")

SYNC_S = 0.5
TTL_S = 86400  # a model's hash outlives a day without traffic by no more


class SharedCounters:
    def __init__(self, redis: Any, queues: Queues, sync_s: float = SYNC_S) -> None:
        self.redis = redis
        self.queues = queues
        self.sync_s = sync_s
        self.task = BackgroundTask("sluice-fair-share", self._run)
        self._totals: dict[tuple[str, str], float] = {}  # the total last read, per (model, tenant)
        self._down = False

    def start(self) -> None:
        self.task.start()

    async def stop(self) -> None:
        await self.task.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.sync_s)
            for model in list(self.queues()):
                await self.sync(model)

    async def sync(self, model: str) -> None:
        """One round for `model`: send what this process served, charge what the others did."""
        queue = self.queues().get(model)
        if queue is None:
            return
        local = queue.take_unsynced()
        tenants = sorted(set(local) | {t for m, t in self._totals if m == model})
        if not tenants:
            return
        key = f"sluice:fair:{model}"
        pipe = self.redis.pipeline(transaction=False)
        for t in tenants:
            pipe.hincrbyfloat(key, t, local.get(t, 0.0))
        pipe.expire(key, TTL_S)
        try:
            totals = await pipe.execute()
        except (RedisError, OSError) as e:
            queue.give_back_unsynced(local)
            if not self._down:
                log.warning("fair-share counters: Redis unreachable (%s); each replica is fair on its own "
                            "until it answers", type(e).__name__)
            self._down = True
            return
        self._down = False
        for t, total in zip(tenants, totals[:-1], strict=True):
            last = self._totals.get((model, t))
            self._totals[(model, t)] = float(total)
            if last is not None:  # first sight: what others served before counts no more than idling here
                remote = float(total) - last - local.get(t, 0.0)
                if remote:
                    queue.charge(t, remote, queue.weights.get(queue.key(t), 1.0), local=False)
