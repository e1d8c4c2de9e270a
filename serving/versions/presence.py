"""A gateway in the cluster state: registered on its own lease with the rollout generation it
serves, watching the state so that every gateway adopts a change within a fraction of a second.

* :meth:`GatewayPresence.watch_forever` polls the store's revision (a cheap read) every
  ``watch_interval_s`` and, when it moved, reloads the rollout state and announces the generation
  this gateway now serves;
* :meth:`GatewayPresence.wait_for_all` is how a rollout step taken through one gateway is seen by
  all of them before it returns: it waits until every live gateway announces the new generation
  (a gateway whose lease lapsed is not live, and refuses writes — below);
* :meth:`GatewayPresence.writable`: a gateway whose lease has lapsed (cut off from the cluster
  state, paused) may be serving an old view, so it takes no writes until it has renewed and
  reloaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from clusterstate.lease import LeaseKeeper
from clusterstate.state import ClusterState
from retrieval.errors import ConfigError, CoordinatorUnavailable, ShardragError

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ClusterSettings:
    # the cluster state every gateway and replica shares: etcd://HOST:PORT[,HOST:PORT...] or
    # file:///PATH (the local coordinator of one machine); None: a private file (a single gateway)
    coordinator: str | None = None
    gateway_lease_s: float = 5.0  # a gateway that stops renewing this long is gone (and stops writing)
    watch_interval_s: float = 0.2  # how often the cluster state's revision is polled
    step_wait_s: float = 10.0  # a rollout step waits this long for every live gateway to adopt it
    fence_hold_s: float = 15.0  # after a step, primaries refuse writes sent under older views this long

    def validate(self) -> None:
        if min(self.gateway_lease_s, self.watch_interval_s, self.step_wait_s, self.fence_hold_s) <= 0:
            raise ConfigError("cluster.* durations must be > 0", field="cluster")
        if self.fence_hold_s <= self.gateway_lease_s:
            raise ConfigError("cluster.fence_hold_s must be longer than cluster.gateway_lease_s (a gateway that has "
                              "not seen a step must have lost its lease before the fence lifts)",
                              field="cluster.fence_hold_s")


class GatewayPresence:
    def __init__(self, state: ClusterState, settings: ClusterSettings, *, url: str = "",
                 current_generation: Callable[[], int], reload: Callable[[], Awaitable[object]]) -> None:
        """``reload``: adopts the stored rollout state, on the event loop (it makes encoders, which
        live on the loop, and swaps the view queries read)."""
        self.state = state
        self.settings = settings
        self.gateway_id = uuid.uuid4().hex[:12]
        self.url = url
        self._current_generation = current_generation
        self._reload = reload
        self._announced = -1
        self._revision = -1
        self._lease: LeaseKeeper | None = None
        self.live_gateways = 1  # re-counted whenever the store moves (a gateway joined or its lease lapsed)

    def start(self) -> GatewayPresence:
        self._lease = LeaseKeeper(self.state.kv, self.settings.gateway_lease_s, name=f"gateway-{self.gateway_id}",
                                  on_new_lease=lambda lease: self._register(force=True)).start()
        self._register(force=True)
        return self

    def writable(self) -> bool:
        return self._lease is not None and self._lease.valid_for_s() > 0

    def _register(self, *, force: bool = False) -> None:
        generation = self._current_generation()
        if self._lease is None or (generation == self._announced and not force):
            return
        self.state.register_gateway(self.gateway_id, self._lease.lease, self.url, generation)
        self._announced = generation

    async def poll(self) -> bool:
        """One watch round: reload when the store moved; whether it did. The store is read on a
        worker thread; the reload runs on the loop."""
        revision = await asyncio.to_thread(self.state.revision)
        if revision == self._revision:
            return False
        await self._reload()
        self._revision = revision  # only once reloaded: a failed reload is tried again next round
        await asyncio.to_thread(self._announce)
        return True

    def _announce(self) -> None:
        self._register()
        self.live_gateways = max(1, len(self.state.gateways()))

    def quota_share(self) -> float:
        """This gateway's share of a cluster-wide requests-per-second quota: the live gateways
        split it evenly (clients spread over them, as a load balancer does)."""
        return 1.0 / self.live_gateways

    async def watch_forever(self) -> None:
        while True:
            try:
                await self.poll()
            except CoordinatorUnavailable as exc:
                logger.warning("cluster state watch: %s", exc.message)
            except ShardragError as exc:
                logger.warning("cluster state watch: %s", exc.message)
            await asyncio.sleep(self.settings.watch_interval_s)

    async def wait_for_all(self, generation: int) -> list[str]:
        """Wait until every live gateway serves ``generation`` (this one announces it first); the
        ones still behind when ``step_wait_s`` ran out (empty: all of them adopted it)."""
        await asyncio.to_thread(self._register)
        deadline = time.monotonic() + self.settings.step_wait_s
        while True:
            gateways = await asyncio.to_thread(self.state.gateways)
            behind = sorted(f"{g} ({v.get('url') or '?'}) at generation {v.get('generation')}"
                            for g, v in gateways.items() if int(v.get("generation", -1)) < generation)
            if not behind or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self._lease is not None:
            self._lease.stop()
            self._lease = None
