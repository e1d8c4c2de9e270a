"""A gateway adopting a rollout state another gateway recorded: the store is read off the loop,
the state adopted on it. The nemesis run across hosts found a write answered 500 ("no current
event loop in thread") when a staged version first reached a gateway through a write's replan:
its encoder was being made on a worker thread."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

from clusterstate.local import LocalKV
from clusterstate.state import ClusterState, RolloutStoreOnKV
from retrieval.rollout import RolloutState
from serving.encoding.service import EncoderService
from serving.encoding.settings import EncoderSettings
from serving.versions.presence import ClusterSettings, GatewayPresence
from serving.versions.registry import VersionRegistry


def test_a_version_staged_elsewhere_gets_its_encoder_on_the_loop_by_every_path(tmp_path):
    state = ClusterState(LocalKV(tmp_path / "state.json"), "docs")
    store = RolloutStoreOnKV(state)
    store.update(lambda _: RolloutState(active="v1", generation=1))
    encoders = EncoderService(EncoderSettings(backend="thread"))
    registry = VersionRegistry([], None, store, encoders=encoders)  # type: ignore[arg-type]  # no replicas: no calls
    presence = GatewayPresence(state, ClusterSettings(gateway_lease_s=30.0, fence_hold_s=60.0),
                               current_generation=lambda: registry.state.generation if registry.state else 0,
                               reload=registry.sync).start()

    def stage(version: str) -> None:  # what another gateway records
        store.update(lambda current: replace(current, staged=version, generation=current.generation + 1,
                                             models={**current.models, version: "default"}))

    async def run() -> None:
        assert await registry.sync() and set(registry.encoders) == {"v1"}
        assert not await registry.sync()  # nothing moved: nothing adopted
        stage("v2")
        assert await presence.poll()  # the watch
        assert set(registry.encoders) == {"v1", "v2"}
        stage("v3")
        assert await registry.sync()  # a write's replan and the staging bring-up call this
        assert set(registry.encoders) == {"v1", "v3"} and registry.state.staged == "v3"
        for encoder in registry.encoders.values():  # each started loading on this loop
            await encoder.wait_ready(120)
            assert encoder.state in ("ready", "mismatch"), encoder.error  # "mismatch": v1 is not MiniLM's id

    try:
        asyncio.run(run())
    finally:
        presence.stop()
        registry.close()


def test_a_read_of_the_store_older_than_this_gateways_own_step_is_not_adopted(tmp_path):
    """CI caught it: `retire` answered, and the next `/admin/rollout` still showed the retired version
    as previous — the background poll had read the store just before the step was recorded, and
    adopted that read just after, taking the gateway back a generation until its next poll."""
    state = ClusterState(LocalKV(tmp_path / "state.json"), "docs")
    store = RolloutStoreOnKV(state)
    store.update(lambda _: RolloutState(active="v1", previous="v0", generation=1))
    registry = VersionRegistry([], None, store, encoders=None)  # type: ignore[arg-type]  # no replicas: no calls
    registry.apply(store.load())
    reading, release = threading.Event(), threading.Event()
    real_load = store.load
    reads: list[int] = []

    def slow_load():  # the poll's read: done, then held until the gateway has recorded its own step
        loaded = real_load()
        reads.append(loaded.generation)
        if len(reads) == 1:
            reading.set()
            assert release.wait(10)
        return loaded

    store.load = slow_load  # type: ignore[method-assign]

    async def run() -> None:
        poll = asyncio.ensure_future(registry.sync())
        await asyncio.to_thread(reading.wait, 10)
        # this gateway's own step, as Rollout._record does it: recorded in the store, then applied
        registry.apply(store.update(lambda current: replace(current, previous=None,
                                                            generation=current.generation + 1)))
        release.set()
        assert not await poll  # the stale read (generation 1) was read again, not adopted
        assert reads == [1, 2]
        assert registry.state.generation == 2 and registry.state.previous is None

    try:
        asyncio.run(run())
    finally:
        registry.close()
