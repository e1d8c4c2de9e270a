"""Upserts, deletes and reads by id, as the gateway carries them out.

An upsert batch is validated whole (nothing is applied when one item is bad; the error names its
index and field), embedded with the encoder of every version a query may be served from (the
active one, and a staged one during a rollout: dual-write), routed (hash partitions: by id;
kmeans: the nearest centroid of the new vector, plus a delete on every other shard so an id that
moved is never found twice), given per-(shard, version) sequence numbers (``sequencer``) and sent
to every replica of each touched shard. The answer comes once ``write_ack`` replicas of every
touched shard have it fsynced; the others keep receiving it in the background.

Replication, catch-up of replicas that missed writes and the repair loop live in
``serving.writes.replication``; bringing a staged version up to date in ``serving.writes.staging``;
routing and embedding in ``serving.writes.plan``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from retrieval.errors import (
    InvalidRequest,
    NotFound,
    ShardragError,
    ShardUnavailable,
    VersionConflict,
)
from retrieval.filters import check_metadata, parse_filter
from retrieval.records import DELETE
from serving.transport.client import ShardClient
from serving.versions.registry import VersionRegistry
from serving.writes.models import (
    MAX_DELETE_BY_FILTER,
    DeleteRequest,
    DocumentIn,
    UpsertRequest,
)
from serving.writes.plan import Item, WriteSettings, route_upserts, shards_holding, vectors_for
from serving.writes.replication import Replicator
from serving.writes.sequencer import Sequencer
from serving.writes.staging import StagedSync

logger = logging.getLogger(__name__)


class WriteService:
    def __init__(self, registry: VersionRegistry, client: ShardClient, sequencer: Sequencer,
                 settings: WriteSettings | None = None) -> None:
        self.registry = registry
        self.client = client
        self.sequencer = sequencer
        self.settings = settings or WriteSettings()
        self.replicator = Replicator(registry, client, sequencer, self.settings)
        self.staging = StagedSync(self.replicator)

    async def prepare_activation(self, version: str) -> None:
        """Before ``version`` is activated, it gets every write it may have missed (staging)."""
        await self.staging.before_activation(version)

    # -- requests --------------------------------------------------------------------------------
    def _earlier(self, request: UpsertRequest | DeleteRequest) -> dict[str, Any] | None:
        """The first reply to this idempotency key, when the request is the same one again; a
        different request under a used key is refused (it would otherwise be silently dropped).
        Called after validation: an invalid request is refused whatever its key."""
        if request.idempotency_key is None:
            return None
        earlier = self.sequencer.recall(request.idempotency_key)
        if earlier is None:
            return None
        if earlier.get("request") != _fingerprint(request):
            raise VersionConflict(f"idempotency_key {request.idempotency_key!r} was used for a different request; "
                                  "use a new key for new content", field="idempotency_key")
        reply: dict[str, Any] = earlier["reply"]
        return reply

    async def upsert(self, request: UpsertRequest) -> dict[str, Any]:
        self._validate(request.documents)
        earlier = self._earlier(request)
        if earlier is not None:
            return earlier
        view = self.registry.view
        versions = await self._target_versions()
        if len(versions) > 1 and any(d.vector is not None for d in request.documents):
            raise VersionConflict(f"versions {versions} are loaded (a rollout is under way): every write goes to "
                                  "each of them, embedded by its own encoder; send text, not vectors",
                                  field="documents")
        plans: dict[str, dict[int, list[Item]]] = {}
        for version in versions:
            snapshot = view.snapshot(version)
            vectors = await vectors_for(request.documents, snapshot)
            plans[version] = route_upserts(request.documents, vectors, snapshot)
        return await self._commit(plans, versions[0], [d.id for d in request.documents], request)

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
        earlier = self._earlier(request)
        if earlier is not None:
            return earlier
        view = self.registry.view
        versions = await self._target_versions()
        found: dict[int, list[str]] = {}  # shard → ids it holds (delete by filter, active version)
        if filter_ is not None:
            found = await self._matching(versions[0], filter_.canonical())
            ids = [doc_id for shard_ids in found.values() for doc_id in shard_ids]
        else:
            assert request.ids is not None
            ids = list(request.ids)
        if not ids:
            return {"ids": [], "seq": {}, "version": versions[0]}
        plans: dict[str, dict[int, list[Item]]] = {}
        for version in versions:
            topology = view.snapshot(version).topology
            plan: dict[int, list[Item]] = defaultdict(list)
            if version == versions[0] and found:
                for shard, shard_ids in found.items():
                    plan[shard].extend(Item(DELETE, doc_id) for doc_id in shard_ids)
            else:
                for doc_id in ids:
                    for shard in shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
                        plan[shard].append(Item(DELETE, doc_id))
            plans[version] = plan
        return await self._commit(plans, versions[0], ids, request)

    async def _matching(self, version: str, filter_canonical: str) -> dict[int, list[str]]:
        """Per shard, the ids the filter selects, as the shard's most up-to-date replica holds them."""
        found: dict[int, list[str]] = {}
        for shard in range(len(self.registry.shard_replicas)):
            for replica in self.replicator.by_applied(shard, version):
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
        for shard in shards_holding(doc_id, topology.num_shards, topology.centroids is not None):
            for replica in self.replicator.by_applied(shard, version):
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
                await self.staging.bring_up(version, versions[0])
        return versions

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

    # -- replication -----------------------------------------------------------------------------
    async def _commit(self, plans: dict[str, dict[int, list[Item]]], active: str, ids: list[str],
                      request: UpsertRequest | DeleteRequest) -> dict[str, Any]:
        ack = request.write_ack
        # plans: the active version first (dict order), shards ascending: the order locks are taken in
        batches = [(version, shard, items) for version, plan in plans.items() for shard, items in sorted(plan.items())]
        results = await self.replicator.replicate_many(batches, ack)
        keys = [(version, shard) for version, shard, _ in batches]
        for result in results:
            if isinstance(result, BaseException):
                raise result
        seq = {str(shard): int(last) for (version, shard), last in zip(keys, results, strict=True)
               if version == active and isinstance(last, int)}
        reply = {"ids": ids, "seq": seq, "version": active}
        if request.idempotency_key is not None:
            await asyncio.to_thread(self.sequencer.remember, request.idempotency_key,
                                    {"request": _fingerprint(request), "reply": reply})
        return reply

    async def repair_forever(self, interval_s: float) -> None:
        await self.replicator.repair_forever(interval_s)

    async def close(self) -> None:
        await self.replicator.close()
        self.sequencer.close()


def _fingerprint(request: UpsertRequest | DeleteRequest) -> str:
    """What makes two requests under one idempotency key the same request."""
    return hashlib.sha256(request.model_dump_json(exclude={"idempotency_key"}).encode()).hexdigest()
