"""Replication of sequenced write batches to every replica of a shard, catch-up of replicas that
fell behind (from a peer's WAL), and the background repair loop (lagging replicas, sequence
numbers taken but never written)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from retrieval.errors import NotFound, ReplicaBehind, ShardragError, ShardUnavailable
from retrieval.records import NOOP, WalRecord, decode_records, encode_records
from serving.transport.client import ShardClient
from serving.versions.registry import VersionRegistry
from serving.writes.models import WriteAck
from serving.writes.plan import Item, WriteSettings, needed_acks
from serving.writes.sequencer import Sequencer

logger = logging.getLogger(__name__)
SNAPSHOT_TIMEOUT_S = 120.0  # fetching and restoring a whole shard's snapshot


class Replicator:
    def __init__(self, registry: VersionRegistry, client: ShardClient, sequencer: Sequencer,
                 settings: WriteSettings) -> None:
        self.registry = registry
        self.client = client
        self.sequencer = sequencer
        self.settings = settings
        # one batch at a time per (shard, version): replicas see seqs in order
        self.locks: dict[tuple[int, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._background: set[asyncio.Task[Any]] = set()
        self._holes: dict[tuple[int, str], tuple[int, float]] = {}  # (shard, version) → (seq, first seen)

    async def replicate(self, version: str, shard: int, items: list[Item], ack: WriteAck) -> int:
        result = (await self.replicate_many([(version, shard, items)], ack))[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def replicate_many(self, batches: list[tuple[str, int, list[Item]]],
                             ack: WriteAck) -> list[int | BaseException]:
        """Sequence and replicate one write's batches (one per touched (version, shard)); per batch
        the last seq, or the error that kept it from ``ack`` replicas. The numbers of every batch are
        taken in one sequencer transaction. Each (shard, version) lock is held from before its
        numbers are taken until its replicas have acknowledged, so replicas see seqs in order; the
        locks are taken in the order given (the active version first, shards ascending — as staging
        takes them), so two writes never wait on each other in a cycle."""
        locks = [self.locks[(shard, version)] for version, shard, _ in batches]
        released = [False] * len(locks)

        def release(index: int) -> None:
            if not released[index]:
                released[index] = True
                locks[index].release()

        acquired = 0
        try:
            for lock in locks:
                await lock.acquire()
                acquired += 1
            # a durable commit (fsync): off the event loop, so queries never wait on the disk
            firsts = await asyncio.to_thread(self.sequencer.take_many,
                                             [(shard, version, len(items)) for version, shard, items in batches])
            return list(await asyncio.gather(
                *(self._replicate_taken(version, shard, items, first, ack, functools.partial(release, index))
                  for index, ((version, shard, items), first) in enumerate(zip(batches, firsts, strict=True))),
                return_exceptions=True))
        finally:
            for index in range(acquired):
                release(index)

    async def _replicate_taken(self, version: str, shard: int, items: list[Item], first: int, ack: WriteAck,
                               release: Callable[[], None]) -> int:
        """Send a sequenced batch to every replica of ``shard``; ``release`` once ``ack`` of them have it."""
        replicas = list(self.registry.shard_replicas[shard])
        needed = needed_acks(ack, len(replicas))
        try:
            records = [WalRecord(first + i, item.op, item.doc_id, item.title, item.text, item.metadata, item.vector)
                       for i, item in enumerate(items)]
            payload = encode_records(records)
            deadline = time.monotonic() + self.settings.timeout_s
            tasks = [asyncio.ensure_future(self._send(replica, shard, version, payload, first, deadline))
                     for replica in replicas]
            ok, errors = 0, []
            for finished in asyncio.as_completed(tasks):
                try:
                    await finished
                    ok += 1
                except ShardragError as exc:
                    errors.append(exc.message)
                if ok >= needed or len(errors) > len(replicas) - needed:
                    break
            for task in tasks:
                if not task.done():  # the rest keep going: every replica should have every write
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                    task.add_done_callback(_consume)
        finally:
            release()
        if ok < needed:
            raise ShardUnavailable(f"shard {shard}: the write reached {ok} of the {needed} replicas {ack} needs "
                                   f"({'; '.join(errors)})", shard=shard)
        return records[-1].seq

    async def _send(self, replica: str, shard: int, version: str, payload: bytes, first_seq: int,
                    deadline: float) -> int:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ShardUnavailable(f"{replica} did not take seq {first_seq} in time", shard=shard)
            try:
                return await self.client.write(replica, shard, version, payload, remaining)
            except ReplicaBehind:
                # the replica misses earlier writes: copy them from a peer's WAL, then again
                if not await self.catch_up(replica, shard, version, first_seq - 1, deadline):
                    await asyncio.sleep(0.02)  # an earlier batch may still be on its way to it

    async def catch_up(self, replica: str, shard: int, version: str, upto: int, deadline: float) -> bool:
        """Bring ``replica`` to at least seq ``upto`` from a peer's WAL. False when no peer could."""
        applied = await self.applied(replica, version)
        if applied is None:
            return False
        if applied >= upto:
            return True
        for peer in self.registry.shard_replicas[shard]:
            if peer == replica:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                try:
                    missing = await self.client.writes_after(peer, version, applied, remaining)
                except NotFound:
                    # The peer compacted those writes away (behind its WAL retention): restore the
                    # replica from the peer's snapshot, then take the writes after it as usual.
                    applied = await self._restore(peer, replica, shard, version)
                    if applied >= upto:
                        return True
                    missing = await self.client.writes_after(peer, version, applied,
                                                             max(deadline - time.monotonic(), 0.1))
                if not missing or decode_records(missing)[-1].seq < upto:
                    continue
                await self.client.write(replica, shard, version, missing, max(deadline - time.monotonic(), 0.1))
                logger.info("%s caught up on %s from %s (seq %d → %d)", replica, version, peer, applied, upto)
                return True
            except (ShardragError, ValueError) as exc:
                logger.info("catch-up of %s from %s: %s", replica, peer, exc)
        return False

    async def _restore(self, peer: str, replica: str, shard: int, version: str) -> int:
        """Copy ``peer``'s snapshot of ``version`` to ``replica``; the replica's applied seq after.
        A snapshot is a whole shard: it gets its own, longer timeout than one write."""
        timeout_s = max(SNAPSHOT_TIMEOUT_S, self.settings.timeout_s)
        snapshot = await self.client.snapshot(peer, version, timeout_s)
        applied = await self.client.restore(replica, shard, version, snapshot, timeout_s)
        logger.warning("%s was behind %s's WAL on %s: restored from its snapshot (%d bytes) at seq %d", replica,
                       peer, version, len(snapshot), applied)
        return applied

    async def applied(self, replica: str, version: str) -> int | None:
        try:
            info = await self.client.info(replica, self.settings.timeout_s)
        except ShardragError:
            return None
        held = info.held().get(version)
        return held.applied_seq if held is not None else None

    def by_applied(self, shard: int, version: str) -> list[str]:
        """The shard's replicas, the one that applied the most writes first (from the last poll)."""
        def applied(replica: str) -> int:
            seq = self._last_known(replica, version)
            return -1 if seq is None else seq

        return sorted(self.registry.shard_replicas[shard], key=applied, reverse=True)

    # -- background ------------------------------------------------------------------------------
    async def repair(self) -> None:
        """Bring lagging replicas up to their peers, and fill numbers taken long ago that no replica
        has (a gateway died between taking them and sending) with no-ops, so writes never stall."""
        view = self.registry.view
        for version in view.versions:
            for shard, replicas in enumerate(self.registry.shard_replicas):
                applied = {r: self._last_known(r, version) for r in replicas}
                known = [a for a in applied.values() if a is not None]
                if not known:
                    continue
                best = max(known)
                deadline = time.monotonic() + self.settings.timeout_s
                for replica, seq in applied.items():
                    if seq is not None and seq < best:
                        await self.catch_up(replica, shard, version, best, deadline)
                await self._fill_hole(shard, version, best)

    def _last_known(self, replica: str, version: str) -> int | None:
        info = self.registry.infos.get(replica)
        held = info.held().get(version) if info is not None else None
        return held.applied_seq if held is not None else None

    async def _fill_hole(self, shard: int, version: str, best: int) -> None:
        taken = self.sequencer.last(shard, version)
        key = (shard, version)
        if taken <= best or self.locks[key].locked():
            self._holes.pop(key, None)
            return
        seen = self._holes.get(key)
        if seen is None or seen[0] != best:
            self._holes[key] = (best, time.monotonic())
            return
        if time.monotonic() - seen[1] < self.settings.hole_fill_after_s:
            return
        logger.warning("shard %d, %s: seqs %d..%d were taken but no replica has them; filling with no-ops",
                       shard, version, best + 1, taken)
        payload = encode_records([WalRecord(seq, NOOP, "") for seq in range(best + 1, taken + 1)])
        deadline = time.monotonic() + self.settings.timeout_s
        await asyncio.gather(*(self._send(r, shard, version, payload, best + 1, deadline)
                               for r in self.registry.shard_replicas[shard]), return_exceptions=True)
        self._holes.pop(key, None)

    async def repair_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.repair()
            except ShardragError as exc:
                logger.warning("write repair: %s", exc.message)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
