"""Upserts, deletes and reads by id, as the gateway carries them out.

An upsert batch is validated whole (nothing is applied when one item is bad; the error names its
index and field), embedded with the encoder of every version a query may be served from (the
active one, and a staged one during a rollout: dual-write), routed (hash partitions: by id;
kmeans: the nearest centroid of the new vector, plus a delete on every other shard so an id that
moved is never found twice), given per-(shard, version) sequence numbers (``sequencer``) and sent
to every replica of each touched shard. The answer comes once ``write_ack`` replicas of every
touched shard have it fsynced; the others keep receiving it in the background.

A replica that missed writes (down, restarted, stopped) answers ``replica_behind``; the service
then copies the records it lacks from a peer's WAL and sends again. The background loop does the
same for replicas that fell behind while nobody wrote to their shard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retrieval.errors import (
    ConfigError,
    DimensionMismatch,
    InvalidRequest,
    NotFound,
    ReplicaBehind,
    ShardragError,
    ShardUnavailable,
    VersionConflict,
)
from retrieval.filters import check_metadata, parse_filter
from retrieval.records import DELETE, NOOP, UPSERT, WalRecord, decode_records, encode_records
from retrieval.routing import assign_to_centroids, hash_shard
from retrieval.types import DocId, Document
from retrieval.wire import check_finite
from serving.transport.client import ShardClient
from serving.versions.registry import VersionRegistry, VersionSnapshot
from serving.writes.models import (
    MAX_DELETE_BY_FILTER,
    MAX_DOCUMENTS,
    MAX_TEXT_CHARS,
    DeleteRequest,
    DocumentIn,
    UpsertRequest,
    WriteAck,
)
from serving.writes.sequencer import Sequencer

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class WriteSettings:
    state_path: str | None = None  # sequence numbers and idempotent replies (None: in memory)
    timeout_s: float = 10.0  # how long a write may take to reach the replicas it needs
    max_document_bytes: int = 1 << 20  # largest document (title + text + metadata)
    hole_fill_after_s: float = 60.0  # a number taken but on no replica after this long becomes a no-op
    max_documents: int = MAX_DOCUMENTS  # per upsert or delete request
    max_text_chars: int = MAX_TEXT_CHARS  # of a title or a text

    def validate(self) -> None:
        if self.timeout_s <= 0 or self.max_document_bytes <= 0 or self.hole_fill_after_s <= self.timeout_s:
            raise ConfigError("writes.timeout_s and max_document_bytes must be > 0, hole_fill_after_s above "
                              "timeout_s", field="writes.timeout_s")
        if not 1 <= self.max_documents <= MAX_DOCUMENTS or not 1 <= self.max_text_chars <= MAX_TEXT_CHARS:
            raise ConfigError(f"writes.max_documents must be 1..{MAX_DOCUMENTS}, max_text_chars 1..{MAX_TEXT_CHARS}",
                              field="writes.max_documents")


def needed_acks(ack: WriteAck, replicas: int) -> int:
    return {"one": 1, "majority": replicas // 2 + 1, "all": replicas}[ack]


@dataclass(slots=True)
class _Item:
    op: int
    doc_id: str
    title: str = ""
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    vector: np.ndarray | None = None


class WriteService:
    def __init__(self, registry: VersionRegistry, client: ShardClient, sequencer: Sequencer,
                 settings: WriteSettings | None = None) -> None:
        self.registry = registry
        self.client = client
        self.sequencer = sequencer
        self.settings = settings or WriteSettings()
        self._locks: dict[tuple[int, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._background: set[asyncio.Task[Any]] = set()
        self._holes: dict[tuple[int, str], tuple[int, float]] = {}  # (shard, version) → (seq, first seen)
        self._sync_lock = asyncio.Lock()  # one staged version brought up to date at a time

    # -- requests --------------------------------------------------------------------------------
    async def upsert(self, request: UpsertRequest) -> dict[str, Any]:
        if request.idempotency_key is not None:
            earlier = self.sequencer.recall(request.idempotency_key)
            if earlier is not None:
                return earlier
        self._validate(request.documents)
        view = self.registry.view
        versions = await self._target_versions()
        if len(versions) > 1 and any(d.vector is not None for d in request.documents):
            raise VersionConflict(f"versions {versions} are loaded (a rollout is under way): every write goes to "
                                  "each of them, embedded by its own encoder; send text, not vectors",
                                  field="documents")
        plans: dict[str, dict[int, list[_Item]]] = {}
        for version in versions:
            snapshot = view.snapshot(version)
            vectors = await self._vectors(request.documents, snapshot)
            plans[version] = self._route_upserts(request.documents, vectors, snapshot)
        return await self._commit(plans, versions[0], [d.id for d in request.documents], request.write_ack,
                                  request.idempotency_key)

    async def delete(self, request: DeleteRequest) -> dict[str, Any]:
        if request.idempotency_key is not None:
            earlier = self.sequencer.recall(request.idempotency_key)
            if earlier is not None:
                return earlier
        if (request.ids is None) == (request.filter is None):
            raise InvalidRequest("give exactly one of ids and filter", field="ids")
        view = self.registry.view
        versions = await self._target_versions()
        found: dict[int, list[str]] = {}  # shard → ids it holds (delete by filter, active version)
        if request.filter is not None:
            filter_ = parse_filter(request.filter)
            if filter_.empty:
                raise InvalidRequest("an empty filter would delete every document; name what to delete",
                                     field="filter")
            found = await self._matching(versions[0], filter_.canonical())
            ids = [doc_id for shard_ids in found.values() for doc_id in shard_ids]
        else:
            assert request.ids is not None
            ids = list(request.ids)
            if len(ids) > self.settings.max_documents:
                raise InvalidRequest(f"{len(ids)} ids; this gateway takes at most {self.settings.max_documents} per "
                                     "request", field="ids")
            self._check_ids(ids, "ids")
        if not ids:
            return {"ids": [], "seq": {}, "version": versions[0]}
        plans: dict[str, dict[int, list[_Item]]] = {}
        for version in versions:
            topology = view.snapshot(version).topology
            plan: dict[int, list[_Item]] = defaultdict(list)
            if version == versions[0] and found:
                for shard, shard_ids in found.items():
                    plan[shard].extend(_Item(DELETE, doc_id) for doc_id in shard_ids)
            else:
                for doc_id in ids:
                    for shard in self._shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
                        plan[shard].append(_Item(DELETE, doc_id))
            plans[version] = plan
        return await self._commit(plans, versions[0], ids, request.write_ack, request.idempotency_key)

    async def _matching(self, version: str, filter_canonical: str) -> dict[int, list[str]]:
        """Per shard, the ids the filter selects, as the shard's most up-to-date replica holds them."""
        found: dict[int, list[str]] = {}
        for shard in range(len(self.registry.shard_replicas)):
            for replica in self._by_applied(shard, version):
                try:
                    ids = await self.client.matching_ids(replica, shard, version, filter_canonical,
                                                         MAX_DELETE_BY_FILTER + 1, self.settings.timeout_s)
                except ShardragError as exc:
                    logger.info("matching ids on %s: %s", replica, exc.message)
                    continue
                found[shard] = ids
                break
            else:
                raise ShardUnavailable(f"no replica of shard {shard} could list the documents the filter selects",
                                       shard=shard)
        total = sum(len(ids) for ids in found.values())
        if total > MAX_DELETE_BY_FILTER:
            raise InvalidRequest(f"the filter selects more than {MAX_DELETE_BY_FILTER} documents; narrow it and "
                                 "delete in steps", field="filter")
        return {shard: ids for shard, ids in found.items() if ids}

    async def get(self, doc_id: str) -> dict[str, Any]:
        """The document as the replica that applied the most writes holds it."""
        self._check_ids([doc_id], "id")
        view = self.registry.view
        version = view.state.active
        topology = view.snapshot(version).topology
        for shard in self._shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
            for replica in self._by_applied(shard, version):
                try:
                    found = await self.client.document(replica, shard, version, doc_id, self.settings.timeout_s)
                except ShardragError as exc:
                    logger.info("reading %s from %s: %s", doc_id, replica, exc.message)
                    continue
                if found is not None:
                    return found
                break  # the most up-to-date reachable replica says it is absent
        raise NotFound(f"no document {doc_id!r}", field="id")

    # -- validation and routing ------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[str], field_name: str) -> None:
        seen: dict[str, int] = {}
        for index, doc_id in enumerate(ids):
            where = f"{field_name}[{index}]" if field_name != "id" else "id"
            if not doc_id.strip():
                raise InvalidRequest(f"{where} is empty", field=where)
            if doc_id in seen:
                raise InvalidRequest(f"{where}: id {doc_id!r} also at index {seen[doc_id]}; one write per id "
                                     "per request", field=where)
            seen[doc_id] = index

    def _validate(self, documents: Sequence[DocumentIn]) -> None:
        if len(documents) > self.settings.max_documents:
            raise InvalidRequest(f"{len(documents)} documents; this gateway takes at most "
                                 f"{self.settings.max_documents} per request", field="documents")
        self._check_ids([d.id for d in documents], "documents")
        for index, doc in enumerate(documents):
            where = f"documents[{index}]"
            if (doc.text is None) == (doc.vector is None):
                raise InvalidRequest(f"{where}: give exactly one of text and vector", field=f"{where}.text")
            if doc.text is not None and not doc.text.strip():
                raise InvalidRequest(f"{where}.text is empty", field=f"{where}.text")
            for name, value in (("title", doc.title), ("text", doc.text or "")):
                if len(value) > self.settings.max_text_chars:
                    raise InvalidRequest(f"{where}.{name} has {len(value)} characters; at most "
                                         f"{self.settings.max_text_chars}", field=f"{where}.{name}")
            check_metadata(doc.metadata, f"{where}.metadata")
            size = len(doc.title.encode()) + len((doc.text or "").encode()) + len(str(doc.metadata).encode())
            if size > self.settings.max_document_bytes:
                raise InvalidRequest(f"{where} is {size} bytes, over the limit of {self.settings.max_document_bytes}",
                                     field=where)

    async def _target_versions(self) -> list[str]:
        """:meth:`_versions`, after bringing a newly staged version up to date (once per staging)."""
        versions = self._versions()
        for version in versions[1:]:
            if version == self.registry.view.state.staged:
                await self._bring_up(version, versions[0])
        return versions

    async def prepare_activation(self, version: str) -> None:
        """Before ``version`` is activated: it has every write (even if none came since staging)."""
        view = self.registry.view
        if version == view.state.staged and version in view.versions:
            await self._bring_up(version, view.state.active)

    async def _bring_up(self, staged: str, active: str) -> None:
        """Give a staged version every write the active one took since its build (it was built
        from a snapshot of the documents): each shard's WAL of the active version, latest record
        per id, re-embedded by the staged version's encoder and written to it, while writes to the
        active version wait. Done once per staging (remembered in the sequencer's store), so an
        activation never loses a write made before the stage command either."""
        state = self.registry.view.state
        key = f"__staged_sync__:{active}->{staged}@{state.generation}"
        if self.sequencer.recall(key) is not None:
            return
        async with self._sync_lock:
            if self.sequencer.recall(key) is not None:
                return
            shards = range(len(self.registry.shard_replicas))
            locks = [self._locks[(shard, active)] for shard in shards]
            for lock in locks:
                await lock.acquire()
            try:
                started = time.monotonic()
                latest: dict[str, WalRecord] = {}
                for shard in shards:
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
                    plan = self._route_upserts(chunk, await self._vectors(chunk, snapshot), snapshot)
                    await asyncio.gather(*(self._replicate(staged, shard, items, "majority")
                                           for shard, items in sorted(plan.items())))
                topology = snapshot.topology
                delete_plan: dict[int, list[_Item]] = defaultdict(list)
                for doc_id in deletes:
                    for shard in self._shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
                        delete_plan[shard].append(_Item(DELETE, doc_id))
                await asyncio.gather(*(self._replicate(staged, shard, items, "majority")
                                       for shard, items in sorted(delete_plan.items())))
                self.sequencer.remember(key, {"upserts": len(upserts), "deletes": len(deletes),
                                              "vector_only": len(vector_only)})
                logger.warning("staged %s brought up to date with %s: %d upserts, %d deletes (%.1f s)", staged,
                               active, len(upserts), len(deletes), time.monotonic() - started)
            finally:
                for lock in locks:
                    lock.release()

    async def _history(self, shard: int, version: str) -> list[WalRecord]:
        """Every write record the shard's most up-to-date reachable replica holds for ``version``."""
        for replica in self._by_applied(shard, version):
            try:
                payload = await self.client.writes_after(replica, version, 0, self.settings.timeout_s)
            except NotFound as exc:
                raise ShardUnavailable(f"shard {shard}: the writes to {version} since its build are compacted away "
                                       f"({exc.message}); build the new version from the current documents",
                                       shard=shard, field="version") from exc
            except ShardragError as exc:
                logger.info("history of shard %d from %s: %s", shard, replica, exc.message)
                continue
            return decode_records(payload)
        raise ShardUnavailable(f"no replica of shard {shard} could send the writes to {version}", shard=shard)

    def _versions(self) -> list[str]:
        """The versions writes go to: the active one first, then the others loaded (a staged version
        during a rollout, the previous one while it drains)."""
        view = self.registry.view
        staged = view.state.staged
        if staged is not None and staged not in view.versions:
            # Until every shard holds it ready it cannot take its copy of a write, and a write it
            # missed would be missing from it after activation: writes wait (503, retry) instead.
            raise ShardUnavailable(f"version {staged} is being staged and is not yet ready on every shard; writes "
                                   "resume once it is (or abort it) — retry shortly", field="version")
        loaded = [v for v in view.state.loaded() if v in view.versions]
        return [view.state.active] + [v for v in loaded if v != view.state.active]

    async def _vectors(self, documents: Sequence[DocumentIn], snapshot: VersionSnapshot) -> np.ndarray:
        dim = snapshot.topology.dim
        out = np.zeros((len(documents), dim), dtype=np.float32)
        to_embed = [i for i, d in enumerate(documents) if d.vector is None]
        for i, doc in enumerate(documents):
            if doc.vector is not None:
                vector = np.asarray(doc.vector, dtype=np.float32)
                if vector.shape != (dim,):
                    raise DimensionMismatch(f"documents[{i}].vector has {vector.size} dims, version "
                                            f"{snapshot.version} has {dim}", field=f"documents[{i}].vector")
                check_finite(vector, field=f"documents[{i}].vector")
                out[i] = vector
        if to_embed:
            if snapshot.encoder is None:
                raise ShardUnavailable(f"no encoder for version {snapshot.version}: send vectors", field="documents")
            embedded = await snapshot.encoder.encode_documents(
                [Document(DocId(documents[i].id), documents[i].text or "", documents[i].title) for i in to_embed])
            out[to_embed] = embedded
        return out

    @staticmethod
    def _shards_holding(doc_id: str, num_shards: int, kmeans: bool) -> list[int]:
        """Where a document may live: its hash shard, or any shard of a kmeans partition."""
        return list(range(num_shards)) if kmeans else [hash_shard(doc_id, num_shards)]

    def _route_upserts(self, documents: Sequence[DocumentIn], vectors: np.ndarray,
                       snapshot: VersionSnapshot) -> dict[int, list[_Item]]:
        topology = snapshot.topology
        plan: dict[int, list[_Item]] = defaultdict(list)
        homes = (assign_to_centroids(vectors, topology.centroids).tolist() if topology.centroids is not None
                 else [hash_shard(d.id, topology.num_shards) for d in documents])
        for doc, vector, home in zip(documents, vectors, homes, strict=True):
            plan[int(home)].append(_Item(UPSERT, doc.id, doc.title, doc.text or "", dict(doc.metadata), vector))
            if topology.centroids is not None:  # the id may have lived elsewhere: never found twice
                for other in range(topology.num_shards):
                    if other != home:
                        plan[other].append(_Item(DELETE, doc.id))
        return plan

    # -- replication -----------------------------------------------------------------------------
    async def _commit(self, plans: dict[str, dict[int, list[_Item]]], active: str, ids: list[str],
                      ack: WriteAck, idempotency_key: str | None) -> dict[str, Any]:
        results = await asyncio.gather(*(self._replicate(version, shard, items, ack)
                                         for version, plan in plans.items() for shard, items in sorted(plan.items())),
                                       return_exceptions=True)
        keys = [(version, shard) for version, plan in plans.items() for shard in sorted(plan)]
        for result in results:
            if isinstance(result, BaseException):
                raise result
        seq = {str(shard): int(last) for (version, shard), last in zip(keys, results, strict=True)
               if version == active and isinstance(last, int)}
        reply = {"ids": ids, "seq": seq, "version": active}
        if idempotency_key is not None:
            self.sequencer.remember(idempotency_key, reply)
        return reply

    async def _replicate(self, version: str, shard: int, items: list[_Item], ack: WriteAck) -> int:
        replicas = list(self.registry.shard_replicas[shard])
        needed = needed_acks(ack, len(replicas))
        async with self._locks[(shard, version)]:  # one batch at a time per shard: replicas see seqs in order
            first = self.sequencer.take(shard, version, len(items))
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
        applied = await self._applied(replica, version)
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
                missing = await self.client.writes_after(peer, version, applied, remaining)
                if not missing or decode_records(missing)[-1].seq < upto:
                    continue
                await self.client.write(replica, shard, version, missing, max(deadline - time.monotonic(), 0.1))
                logger.info("%s caught up on %s from %s (seq %d → %d)", replica, version, peer, applied, upto)
                return True
            except (ShardragError, ValueError) as exc:
                logger.info("catch-up of %s from %s: %s", replica, peer, exc)
        return False

    async def _applied(self, replica: str, version: str) -> int | None:
        try:
            info = await self.client.info(replica, self.settings.timeout_s)
        except ShardragError:
            return None
        held = info.held().get(version)
        return held.applied_seq if held is not None else None

    def _by_applied(self, shard: int, version: str) -> list[str]:
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
        if taken <= best or self._locks[key].locked():
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
        self.sequencer.close()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
