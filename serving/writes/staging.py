"""A staged embedding version brought up to date before it takes writes, then synced.

A version built from a live collection records the cut it was read at: per shard of the active
version, the seq of the last write it holds (``source_seqs`` in its manifest; a version built
from a corpus file starts from seq 0). Bringing it up to date replays, per shard, only the active
version's writes after that cut — never the whole history, which a primary's log may no longer
hold — re-embedded by the staged version's encoder:

1. **rounds without any lock or pause**: each round reads every shard's writes since the last
   round from its primary, folds them (below) and writes the result to the staged version; writes
   to the active version go on meanwhile. Rounds repeat until one finds only a few new writes;
2. **a short fence**: every primary is asked to refuse writes sent under the current rollout
   generation (for a few seconds at most — it lapses if this gateway dies), which returns where
   each shard's log stands; the last stretch up to there is replayed;
3. the ``sync`` transition is recorded (generation + 1): from then every gateway writes to both
   versions, and a gateway that has not seen it yet is refused by the fence and reloads.

**Folding** a shard's records keeps the newest record per document; across shards, a document
whose newest record on some shard is an upsert is live with that content (a kmeans upsert also
deletes the id on every other shard, marked ``moved``, which never counts as a delete), one whose
newest record is a real delete is deleted, and one only moved away keeps what the build read.
Documents written as vectors only cannot be re-embedded: a warning names how many. Documents
stored without a vector (``no_vector``) are written to it without one.

A **created collection's** staged version has no build of its own: its nodes made an empty base
of it when the rollout staged it (serving.gateway.collection_rollout). ``bring_up(from_live=True)``
first fills it: each shard's live documents of the active version are read from its primary at
one seq (a snapshot) — that seq is the shard's cut — re-embedded and written through the write
path; whatever the staged version still holds that the active one does not (an aborted attempt's
documents, deleted since) is deleted. The rounds above then replay the writes after the cuts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from retrieval import rollout as protocol
from retrieval.errors import ConfigError, NotFound, ShardragError, ShardUnavailable
from retrieval.records import DELETE, NOOP, UPSERT, Snapshot, WalRecord, decode_records, encode_records
from retrieval.rollout import RolloutRefused
from serving.writes.models import DocumentIn
from serving.writes.plan import Item, route_upserts, shards_holding, vectors_for
from serving.writes.snapshots import live_snapshot

if TYPE_CHECKING:
    from serving.writes.service import WriteService

logger = logging.getLogger(__name__)

QUIET_ROUND = 50  # a round with fewer new writes than this ends the unfenced rounds
MAX_ROUNDS = 20
FENCE_HOLD_S = 30.0  # how long a fence holds if the gateway that set it never records the sync
CHUNK = 256  # documents re-embedded and written per batch


class StagedSync:
    def __init__(self, writes: WriteService) -> None:
        self.writes = writes
        self.registry = writes.registry
        self.client = writes.client
        self._lock = asyncio.Lock()  # one bring-up at a time in this gateway

    async def bring_up(self, staged: str, *, from_live: bool = False) -> None:
        """Give ``staged`` every write the active version took since its build, then record the
        ``sync`` (module docstring). Nothing to do when it is synced already. ``from_live``: the
        staged version is an empty base (a created collection's rollout): it is first filled with
        every live document of the active version, read from each shard's primary, re-embedded."""
        async with self._lock:
            await self.registry.sync()
            state = self.registry.view.state
            if state.staged != staged or state.synced:
                return
            started = time.monotonic()
            active, generation = state.active, state.generation
            shards = len(self.registry.shard_replicas)
            newest: list[dict[str, WalRecord]] = [{} for _ in range(shards)]
            replayed = 0
            if from_live:
                positions, replayed = await self._fill(active, staged, newest, generation)
            else:
                positions = list(self._source(staged, active, shards))
            for _ in range(MAX_ROUNDS):
                fresh = await self._round(active, staged, positions, newest, generation, None)
                replayed += fresh
                if fresh < QUIET_ROUND:
                    break
            fenced_at = time.monotonic()
            ends = await self._fence(generation + 1)
            replayed += await self._round(active, staged, positions, newest, generation + 1, ends)

            def record(current: protocol.RolloutState | None) -> protocol.RolloutState:
                if time.monotonic() - fenced_at > FENCE_HOLD_S * 0.8:
                    # the fence may lapse before every gateway writes to both: a write of the old
                    # view could then reach the active version only — never record a sync then
                    raise RolloutRefused("the last stretch of writes took longer than the fence holds; run the "
                                         "step again", field="version")
                if current is None or current.generation != generation:
                    raise RolloutRefused("the rollout state changed while the staged version was brought up to "
                                         "date; run the step again", field="version")
                return protocol.sync(current, staged, time.time(),
                                     detail=f"{replayed} writes replayed from {active}").state

            new_state = await asyncio.to_thread(self.registry.store.update, record)
            self.registry.apply(new_state)
            logger.warning("staged %s brought up to date with %s: %d writes replayed (%.1f s)", staged, active,
                           replayed, time.monotonic() - started)

    def _source(self, staged: str, active: str, shards: int) -> tuple[int, ...]:
        """Where the staged version's build read the active one: per shard, the seq to replay after."""
        for info in self.registry.infos.values():
            held = info.held().get(staged) if info is not None else None
            if held is None or held.embedding_version is None:
                continue
            if held.source_version is None:
                return (0,) * shards  # built from a corpus file: every write since the active one's build
            if held.source_version != active:
                raise RolloutRefused(f"{staged} was built from {held.source_version}, not from the active version "
                                     f"{active}: rebuild it from {active}", field="version")
            seqs = tuple(held.source_seqs or ())
            if len(seqs) != shards:
                raise ConfigError(f"{staged} records {len(seqs)} source seqs for {shards} shards", field="version")
            return seqs
        raise ShardUnavailable(f"no replica reports {staged}: it is not loaded", field="version")

    async def _fill(self, active: str, staged: str, newest: list[dict[str, WalRecord]],
                    generation: int) -> tuple[list[int], int]:
        """Every live document of ``active`` (each shard read at one seq: its cut) replayed into
        ``staged``, and whatever ``staged`` holds that ``active`` no longer does deleted (an earlier
        attempt's documents, deleted since). The cuts, and how many documents were read."""
        positions: list[int] = []
        stale: list[str] = []
        for shard in range(len(newest)):
            live = await self._live(shard, active)
            positions.append(live.seq)
            newest[shard].update((record.doc_id, record) for record in live.records)
            held = await self._live(shard, staged)
            stale.extend(record.doc_id for record in held.records if record.doc_id not in newest[shard])
        upserts, deletes = fold({doc_id for shard in newest for doc_id in shard}, newest)
        logger.warning("filling %s from the %d live documents of %s (cut at seqs %s)", staged, len(upserts), active,
                       positions)
        await self._replay(staged, upserts, [*deletes, *stale], generation)
        return positions, len(upserts)

    async def _live(self, shard: int, version: str) -> Snapshot:
        """The shard's live documents of ``version`` at one seq, from its primary (else any replica)."""
        return Snapshot.decode(await live_snapshot(self.writes, shard, version))

    async def _history(self, shard: int, version: str, after: int) -> list[WalRecord]:
        """The shard's writes to ``version`` after ``after``, from its primary (else any replica)."""
        errors = []
        for replica in self.writes.primary_first(shard):  # the same order reads use
            try:
                payload = await self.client.writes_after(replica, version, after, self.writes.settings.timeout_s)
            except NotFound as exc:
                raise ShardUnavailable(f"shard {shard}: the writes to {version} after seq {after} are no longer in "
                                       f"its log ({exc.message}); build the new version from the live collection again",
                                       shard=shard, field="version") from exc
            except ShardragError as exc:
                errors.append(exc.message)
                continue
            return decode_records(payload)
        raise ShardUnavailable(f"no replica of shard {shard} could send the writes to {version}: {'; '.join(errors)}",
                               shard=shard)

    async def _round(self, active: str, staged: str, positions: list[int], newest: list[dict[str, WalRecord]],
                     generation: int, ends: list[int] | None) -> int:
        """Read each shard's writes after ``positions`` (up to ``ends``), fold and replay them."""
        touched: set[str] = set()
        count = 0
        for shard in range(len(positions)):
            if ends is not None and positions[shard] >= ends[shard]:
                continue
            for record in await self._history(shard, active, positions[shard]):
                if ends is not None and record.seq > ends[shard]:
                    break
                positions[shard] = record.seq
                if record.op == NOOP:
                    continue
                newest[shard][record.doc_id] = record
                touched.add(record.doc_id)
                count += 1
        if ends is not None:
            short = [shard for shard in range(len(positions)) if positions[shard] < ends[shard]]
            if short:  # read from a replica that lags behind its primary's fence: never sync on that
                raise ShardUnavailable(f"shards {short}: the writes up to the fence could not be read; run the "
                                       "step again", field="version")
        upserts, deletes = fold(touched, newest)
        await self._replay(staged, upserts, deletes, generation)
        return count

    async def _replay(self, staged: str, upserts: list[WalRecord], deletes: list[str], generation: int) -> None:
        vector_only = [r.doc_id for r in upserts
                       if r.vector is not None and not r.text.strip() and not r.title.strip()]
        if vector_only:
            logger.warning("%d documents written as vectors only cannot be re-embedded for %s; they are missing "
                           "from it (send text to keep documents across rollouts)", len(vector_only), staged)
        # text is embedded by the staged encoder; a document stored without a vector stays without one
        texts = [r for r in upserts if r.vector is None or r.text.strip() or r.title.strip()]
        snapshot = self.registry.view.snapshot(staged)
        for start in range(0, len(texts), CHUNK):
            chunk = [DocumentIn(id=r.doc_id, title=r.title, text=r.text or r.title or None, metadata=dict(r.metadata),
                                no_vector=r.vector is None)
                     for r in texts[start:start + CHUNK]]
            upsert_plan = route_upserts(chunk, await vectors_for(chunk, snapshot), snapshot)
            await self._send(staged, upsert_plan, generation)
        topology = snapshot.topology
        for start in range(0, len(deletes), CHUNK * 4):
            plan: dict[int, list[Item]] = defaultdict(list)
            for doc_id in deletes[start:start + CHUNK * 4]:
                for shard in shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
                    plan[shard].append(Item(DELETE, doc_id))
            await self._send(staged, plan, generation)

    async def _send(self, version: str, plan: dict[int, list[Item]], generation: int) -> None:
        await asyncio.gather(*(self.writes.send(version, shard, encode_records([i.record() for i in items]),
                                                "majority", generation)
                               for shard, items in sorted(plan.items()) if items))

    async def _fence(self, generation: int) -> list[int]:
        """Every shard's primary refuses writes of older views for a while; where each log stands."""
        active = self.registry.view.state.active
        ends = []
        for shard in range(len(self.registry.shard_replicas)):
            deadline = time.monotonic() + self.writes.settings.timeout_s
            while True:
                primary = self.writes.primaries.primary(shard) or await self.writes.primaries.refresh(shard)
                try:
                    if primary is None:
                        raise ShardUnavailable(f"shard {shard} has no primary", shard=shard)
                    answer = await self.client.fence(primary, generation, FENCE_HOLD_S, self.writes.settings.timeout_s)
                    if not answer.get("is_primary"):
                        raise ShardUnavailable(f"{primary} is not the primary of shard {shard} any more", shard=shard)
                    ends.append(int(answer["applied_seq"][active]))
                    break
                except ShardragError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
                    await self.writes.primaries.refresh(shard)
        return ends


def fold(touched: set[str], newest: list[dict[str, WalRecord]]) -> tuple[list[WalRecord], list[str]]:
    """The upserts and deletes the newest records of each shard add up to (module docstring)."""
    upserts: list[WalRecord] = []
    deletes: list[str] = []
    for doc_id in sorted(touched):
        latest = [shard[doc_id] for shard in newest if doc_id in shard]
        live = [r for r in latest if r.op == UPSERT]
        if live:
            upserts.append(max(live, key=lambda r: r.seq))
        elif any(r.op == DELETE and not r.moved for r in latest):
            deletes.append(doc_id)
    return upserts, deletes
