"""Upserts, deletes and reads by id, as the gateway carries them out.

An upsert batch is validated whole (nothing is applied when one item is bad; the error names its
index and field), embedded with the encoder of every version writes go to (the active one, a
staged one once it is synced, the previous one while it is loaded: dual-write), routed (hash
partitions: by id; kmeans: the nearest centroid of the new vector, plus a delete on every other
shard so an id that moved is never found twice) and sent, per (version, shard), to the shard's
**primary**, which numbers it under its term, replicates it to the in-sync replicas and answers
once ``write_ack`` of them have it fsynced (``index_shards.primary``). The gateway keeps no
ordering state: any number of gateways write to one collection, and any of them may die.

A write carries the rollout generation of the gateway's view; a primary that has seen a newer one
refuses it (``stale_view``) and the gateway reloads the cluster state and plans the write again,
so a write never misses a version that another gateway started writing to. An idempotency key
travels in every record: a primary answers a key it has applied with the first outcome.

Which replica is primary: ``serving.writes.primaries``; bringing a staged version up to date:
``serving.writes.staging``; routing and embedding: ``serving.writes.plan``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from httpkit import tracing
from retrieval.blank import is_blank
from retrieval.contract import WriteReply
from retrieval.errors import (
    DeadlineExceeded,
    InvalidRequest,
    NotFound,
    NotPrimary,
    ShardragError,
    ShardUnavailable,
    StaleView,
    VersionConflict,
)
from retrieval.filters import check_metadata, parse_filter
from retrieval.records import DELETE, NOOP, encode_records
from serving.transport.client import ShardClient
from serving.versions.registry import RegistryView, VersionRegistry
from serving.writes.models import (
    MAX_DELETE_BY_FILTER,
    DeleteRequest,
    DocumentIn,
    UpsertRequest,
)
from serving.writes.plan import Item, WriteSettings, request_fingerprint, route_upserts, shards_holding, vectors_for
from serving.writes.primaries import PrimaryDirectory
from serving.writes.staging import StagedSync


class _Replan(Exception):
    """A primary has seen a newer rollout generation: reload the cluster state and plan again."""

logger = logging.getLogger(__name__)


class WriteService:
    def __init__(self, registry: VersionRegistry, client: ShardClient, settings: WriteSettings | None = None, *,
                 writable: Callable[[], bool] = lambda: True) -> None:
        """``writable``: whether this gateway's view of the cluster state can be trusted now (its
        registration's lease holds: ``serving.versions.presence``)."""
        self.registry = registry
        self.client = client
        self.settings = settings or WriteSettings()
        self.writable = writable
        self.primaries = PrimaryDirectory(registry, client)
        self.staging = StagedSync(self)

    async def prepare_activation(self, version: str) -> None:
        """Before ``version`` is activated, it has every write the active version took (staging)."""
        await self.staging.bring_up(version)

    # -- requests --------------------------------------------------------------------------------
    async def upsert(self, request: UpsertRequest) -> dict[str, Any]:
        self._validate(request.documents)
        return await self._replanned(lambda: self._upsert(request))

    async def _upsert(self, request: UpsertRequest) -> dict[str, Any]:
        view = self.registry.view  # one view for the plan and the generation it is sent under
        versions = self._versions(view)
        if len(versions) > 1 and any(d.vector is not None for d in request.documents):
            raise VersionConflict(f"versions {versions} are loaded (a rollout is under way): every write goes to "
                                  "each of them, embedded by its own encoder; send text, not vectors",
                                  field="documents")
        plans: dict[str, dict[int, list[Item]]] = {}
        for version in versions:
            snapshot = view.snapshot(version)
            vectors = await vectors_for(request.documents, snapshot)
            plans[version] = route_upserts(request.documents, vectors, snapshot)
        return await self._commit(plans, versions[0], [d.id for d in request.documents], request,
                                  view.state.generation)

    async def delete(self, request: DeleteRequest) -> dict[str, Any]:
        if (request.ids is None) == (request.filter is None):
            raise InvalidRequest("give exactly one of ids and filter", field="ids")
        filter_ = parse_filter(request.filter) if request.filter is not None else None
        if filter_ is not None and filter_.empty:
            raise InvalidRequest("an empty filter would delete every document; name what to delete", field="filter")
        if request.ids is not None:
            if len(request.ids) > self.settings.max_documents:
                raise InvalidRequest(f"{len(request.ids)} ids; this gateway takes at most "
                                     f"{self.settings.max_documents} per request", field="ids")
            self._check_ids(request.ids, "ids")
        return await self._replanned(lambda: self._delete(request, filter_.canonical() if filter_ else None))

    async def _delete(self, request: DeleteRequest, filter_canonical: str | None) -> dict[str, Any]:
        view = self.registry.view
        versions = self._versions(view)
        found: dict[int, list[str]] = {}  # shard → ids it holds (delete by filter, active version)
        if filter_canonical is not None:
            found = await self._matching(versions[0], filter_canonical)
            ids = [doc_id for shard_ids in found.values() for doc_id in shard_ids]
        else:
            assert request.ids is not None
            ids = list(request.ids)
        if not ids and request.idempotency_key is None:
            return {"ids": [], "seq": {}, "term": {}, "version": versions[0]}
        plans: dict[str, dict[int, list[Item]]] = {}
        for version in versions:
            topology = view.snapshot(version).topology
            plan: dict[int, list[Item]] = defaultdict(list)
            if filter_canonical is not None and version == versions[0]:
                for shard, shard_ids in found.items():
                    plan[shard].extend(Item(DELETE, doc_id) for doc_id in shard_ids)
            else:
                for doc_id in ids:
                    for shard in shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
                        plan[shard].append(Item(DELETE, doc_id))
            plans[version] = plan
        return await self._commit(plans, versions[0], ids, request, view.state.generation)

    async def _replanned(self, attempt: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """``attempt``, planned again with the cluster state reloaded each time a primary says the
        plan was made under an old view. While a rollout step is being recorded the primaries hold
        writes back behind a fence for a moment: the write waits (within its deadline) rather than
        failing."""
        deadline = time.monotonic() + self.settings.timeout_s
        pause = 0.02
        while True:
            try:
                return await attempt()
            except _Replan:
                if time.monotonic() + pause > deadline:
                    raise ShardUnavailable("the cluster state kept changing under this write (a rollout step); "
                                           "retry it", field="version") from None
                await self.registry.sync()
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.5)

    async def _matching(self, version: str, filter_canonical: str) -> dict[int, list[str]]:
        """Per shard, the ids the filter selects, as the shard's most up-to-date replica holds them."""
        found: dict[int, list[str]] = {}
        for shard in range(len(self.registry.shard_replicas)):
            for replica in self.primary_first(shard):
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

    def primary_first(self, shard: int) -> list[str]:
        """The shard's replicas, its primary (which has every acknowledged write) first."""
        primary = self.primaries.primary(shard)
        replicas = list(self.registry.shard_replicas[shard])
        return ([primary] if primary in replicas else []) + [r for r in replicas if r != primary]

    async def get(self, doc_id: str) -> dict[str, Any]:
        """The document as the shard's primary holds it (another replica when it cannot answer)."""
        self._check_ids([doc_id], "id")
        view = self.registry.view
        version = view.state.active
        topology = view.snapshot(version).topology
        for shard in shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
            for replica in self.primary_first(shard):
                try:
                    found = await self.client.document(replica, shard, version, doc_id, self.settings.timeout_s)
                except ShardragError as exc:
                    logger.info("reading %s from %s: %s", doc_id, replica, exc.message)
                    continue
                if found is not None:
                    return found
                break  # the most up-to-date reachable replica (the primary) says it is absent
        raise NotFound(f"no document {doc_id!r}", field="id")

    # -- validation and routing ------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[str], field_name: str, suffix: str = "") -> None:
        """Every id named (not blank: retrieval.blank, as the schema's pattern says) and named once."""
        seen: dict[str, int] = {}
        for index, doc_id in enumerate(ids):
            where = f"{field_name}[{index}]{suffix}" if field_name != "id" else "id"
            if is_blank(doc_id):
                raise InvalidRequest(f"{where} is empty or white space only", field=where)
            if doc_id in seen:
                raise InvalidRequest(f"{where}: id {doc_id!r} also at index {seen[doc_id]}; one write per id "
                                     "per request", field=where)
            seen[doc_id] = index

    def _validate(self, documents: Sequence[DocumentIn]) -> None:
        if len(documents) > self.settings.max_documents:
            raise InvalidRequest(f"{len(documents)} documents; this gateway takes at most "
                                 f"{self.settings.max_documents} per request", field="documents")
        self._check_ids([d.id for d in documents], "documents", ".id")
        for index, doc in enumerate(documents):
            where = f"documents[{index}]"
            if doc.no_vector and doc.vector is not None:
                raise InvalidRequest(f"{where}: no_vector stores a document without a vector; it cannot come with "
                                     "one", field=f"{where}.no_vector")
            if doc.text is None and doc.vector is None and not doc.no_vector:
                raise InvalidRequest(f"{where}: give text, a vector, or both (the vector is then used and the text "
                                     "stored), or no_vector: true", field=f"{where}.text")
            if doc.text is not None and is_blank(doc.text):
                raise InvalidRequest(f"{where}.text is empty or white space only", field=f"{where}.text")
            for name, value in (("title", doc.title), ("text", doc.text or "")):
                if len(value) > self.settings.max_text_chars:
                    raise InvalidRequest(f"{where}.{name} has {len(value)} characters; at most "
                                         f"{self.settings.max_text_chars}", field=f"{where}.{name}")
            check_metadata(doc.metadata, f"{where}.metadata")
            size = len(doc.title.encode()) + len((doc.text or "").encode()) + len(str(doc.metadata).encode())
            if size > self.settings.max_document_bytes:
                raise InvalidRequest(f"{where} is {size} bytes, over the limit of {self.settings.max_document_bytes}",
                                     field=where)

    def _versions(self, view: RegistryView) -> list[str]:
        """The versions writes go to: the active one first, then a staged one once it is synced
        (brought up to date, ``serving.writes.staging``) and the previous one while it is loaded."""
        targets = view.state.write_targets()
        missing = [v for v in targets if v not in view.versions]
        if missing:
            raise ShardUnavailable(f"version {missing[0]} takes writes but is not held ready by a replica of every "
                                   "shard; retry shortly", field="version")
        return list(targets)

    # -- sending --------------------------------------------------------------------------------
    async def _commit(self, plans: dict[str, dict[int, list[Item]]], active: str, ids: list[str],
                      request: UpsertRequest | DeleteRequest, generation: int) -> dict[str, Any]:
        """Send the plans under ``generation``: that of the view they were made from, never a newer
        one (a plan of the old view's versions sent under the new generation would pass a sync's
        fence and reach only the active version)."""
        if not self.writable():
            raise ShardUnavailable("this gateway's registration in the cluster state has lapsed (cut off from it, or "
                                   "paused): it takes no writes until it has renewed it and reloaded the state; retry "
                                   "(through another gateway)", field="cluster")
        key = request.idempotency_key or ""
        fingerprint = request_fingerprint(request) if key else ""
        parts: list[tuple[str, int, bytes]] = []
        shards = range(len(self.registry.shard_replicas))
        for version, plan in plans.items():
            for shard in shards:
                items = plan.get(shard, [])
                if items:
                    parts.append((version, shard, encode_records([i.record(key, fingerprint) for i in items])))
                elif key:  # the key is recorded on every shard: a retry finds every part it applied
                    parts.append((version, shard, encode_records([Item(NOOP, "").record(key, fingerprint)])))
        results = await asyncio.gather(*(self.send(v, s, payload, request.write_ack, generation)
                                         for v, s, payload in parts), return_exceptions=True)
        replan = any(isinstance(r, _Replan) for r in results)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, _Replan):
                raise result
        if replan:
            raise _Replan()
        replies = [r for r in results if isinstance(r, WriteReply)]
        # per shard of the active version the first request wrote to (a key-only no-op part does not count)
        counted = [r for (version, _, _), r in zip(parts, replies, strict=True)
                   if version == active and (r.doc_ids if r.duplicate else plans[version].get(r.shard_id))]
        seq = {str(r.shard_id): r.last_seq for r in counted}
        term = {str(r.shard_id): r.term for r in counted}  # with seq, what a session read asks for (min_term)
        if any(r.duplicate for r in replies) and isinstance(request, DeleteRequest) and request.filter is not None:
            ids = sorted({*ids, *(i for r in replies if r.duplicate and r.version == active for i in r.doc_ids)})
        return {"ids": ids, "seq": seq, "term": term, "version": active}

    async def send(self, version: str, shard: int, payload: bytes, ack: str, generation: int) -> WriteReply:
        """One (version, shard) batch to the shard's primary, retried — a new primary looked up —
        until the write's deadline."""
        if tracing.recording():
            with tracing.span("write.shard", **{"shardrag.shard": shard, "shardrag.version": version,
                                                "shardrag.bytes": len(payload), "shardrag.ack": ack}):
                return await self._send(version, shard, payload, ack, generation)
        return await self._send(version, shard, payload, ack, generation)

    async def _send(self, version: str, shard: int, payload: bytes, ack: str, generation: int) -> WriteReply:
        deadline = time.monotonic() + self.settings.timeout_s
        last_error = "no primary yet (an election is under way)"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ShardUnavailable(f"shard {shard}: the write did not reach a primary in "
                                       f"{self.settings.timeout_s:.0f} s ({last_error}); retry it with the same "
                                       "idempotency_key", shard=shard)
            primary = self.primaries.primary(shard) or await self.primaries.refresh(shard)
            if primary is None:
                last_error = self.primaries.why_none(shard)
                await asyncio.sleep(min(0.1, remaining))
                continue
            try:
                return await self.client.primary_write(primary, shard, version, payload, ack, generation,
                                                       min(remaining, self.settings.attempt_timeout_s))
            except StaleView as exc:
                raise _Replan() from exc
            except NotPrimary as exc:
                last_error = exc.message
                await self.primaries.refresh(shard, not_this=primary)
            except (ShardUnavailable, DeadlineExceeded) as exc:
                last_error = exc.message
                await asyncio.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
                if await self.primaries.refresh(shard) is None:
                    last_error = f"{exc.message}; {self.primaries.why_none(shard)}"

    async def fence_all(self, generation: int, hold_s: float) -> None:
        """Every shard's primary refuses writes sent under older rollout generations for ``hold_s``
        (after a rollout step: a gateway that has not adopted it yet reloads before it writes)."""
        async def one(shard: int) -> None:
            primary = self.primaries.primary(shard) or await self.primaries.refresh(shard)
            if primary is None:
                logger.warning("shard %d has no primary to fence at generation %d", shard, generation)
                return
            try:
                await self.client.fence(primary, generation, hold_s, self.settings.timeout_s)
            except ShardragError as exc:
                logger.warning("fencing shard %d at generation %d: %s", shard, generation, exc.message)

        await asyncio.gather(*(one(shard) for shard in range(len(self.registry.shard_replicas))))

    async def close(self) -> None:
        pass
