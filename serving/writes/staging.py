"""A staged embedding version brought up to date before it takes writes or is activated.

It was built from a snapshot of the documents; every write the active version took since (each
shard's WAL, latest record per id) is re-embedded by the staged version's encoder and written to
it while writes to the active version wait. Remembered in memory per staging (the rollout state's
generation): a restarted gateway does it once more, which is harmless — upserts of the same
content and deletes of absent ids change nothing a query can see.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from retrieval.errors import NotFound, ShardragError, ShardUnavailable
from retrieval.records import DELETE, NOOP, UPSERT, WalRecord, decode_records
from serving.writes.models import DocumentIn
from serving.writes.plan import Item, route_upserts, shards_holding, vectors_for
from serving.writes.replication import Replicator

logger = logging.getLogger(__name__)


class StagedSync:
    def __init__(self, replicator: Replicator) -> None:
        self.replicator = replicator
        self.registry = replicator.registry
        self._done: set[tuple[str, str, int]] = set()  # (active, staged, rollout generation)
        self._lock = asyncio.Lock()  # one staged version brought up to date at a time

    async def before_activation(self, version: str) -> None:
        """Before ``version`` is activated: it has every write (even if none came since staging)."""
        view = self.registry.view
        if version == view.state.staged and version in view.versions:
            await self.bring_up(version, view.state.active)

    async def bring_up(self, staged: str, active: str) -> None:
        """Give ``staged`` every write ``active`` took since its build (module docstring)."""
        key = (active, staged, self.registry.view.state.generation)
        if key in self._done:
            return
        async with self._lock:
            if key in self._done:
                return
            sequencer = self.replicator.sequencer
            if all(sequencer.last(shard, active) == 0 for shard in range(len(self.registry.shard_replicas))):
                self._done.add(key)  # the active version never took a write: nothing to bring
                return
            shards = range(len(self.registry.shard_replicas))
            locks = [self.replicator.locks[(shard, active)] for shard in shards]
            for lock in locks:
                await lock.acquire()
            try:
                started = time.monotonic()
                latest: dict[str, WalRecord] = {}
                for shard in shards:
                    if sequencer.last(shard, active) == 0:
                        continue
                    for record in await self._history(shard, active):
                        if record.op != NOOP:
                            latest[record.doc_id] = record
                upserts = [r for r in latest.values() if r.op == UPSERT and r.text.strip()]
                vector_only = [r.doc_id for r in latest.values() if r.op == UPSERT and not r.text.strip()]
                deletes = [r.doc_id for r in latest.values() if r.op == DELETE]
                if vector_only:  # nothing to re-embed them from: the staged version cannot hold them
                    logger.warning("%d documents written to %s as vectors only cannot be re-embedded for %s; they "
                                   "are missing from it (send text to keep them across rollouts)", len(vector_only),
                                   active, staged)
                snapshot = self.registry.view.snapshot(staged)
                for start in range(0, len(upserts), 256):
                    chunk = [DocumentIn(id=r.doc_id, title=r.title, text=r.text, metadata=dict(r.metadata))
                             for r in upserts[start:start + 256]]
                    plan = route_upserts(chunk, await vectors_for(chunk, snapshot), snapshot)
                    await asyncio.gather(*(self.replicator.replicate(staged, shard, items, "majority")
                                           for shard, items in sorted(plan.items())))
                topology = snapshot.topology
                delete_plan: dict[int, list[Item]] = defaultdict(list)
                for doc_id in deletes:
                    for shard in shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
                        delete_plan[shard].append(Item(DELETE, doc_id))
                await asyncio.gather(*(self.replicator.replicate(staged, shard, items, "majority")
                                       for shard, items in sorted(delete_plan.items())))
                self._done.add(key)
                logger.warning("staged %s brought up to date with %s: %d upserts, %d deletes (%.1f s)", staged,
                               active, len(upserts), len(deletes), time.monotonic() - started)
            finally:
                for lock in locks:
                    lock.release()

    async def _history(self, shard: int, version: str) -> list[WalRecord]:
        """Every write record the shard's most up-to-date reachable replica holds for ``version``."""
        for replica in self.replicator.by_applied(shard, version):
            try:
                payload = await self.replicator.client.writes_after(replica, version, 0,
                                                                    self.replicator.settings.timeout_s)
            except NotFound as exc:
                raise ShardUnavailable(f"shard {shard}: the writes to {version} since its build are compacted away "
                                       f"({exc.message}); build the new version from the current documents",
                                       shard=shard, field="version") from exc
            except ShardragError as exc:
                logger.info("history of shard %d from %s: %s", shard, replica, exc.message)
                continue
            return decode_records(payload)
        raise ShardUnavailable(f"no replica of shard {shard} could send the writes to {version}", shard=shard)
