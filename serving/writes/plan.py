"""What a write is made of before it is replicated: the settings, one record to send, the
routing and embedding of an upsert batch for one version, and a request's fingerprint (what makes
two requests under one idempotency key the same)."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from httpkit import tracing
from retrieval.errors import ConfigError, DimensionMismatch, InvalidRequest, ShardUnavailable
from retrieval.records import DELETE, UPSERT, WalRecord
from retrieval.routing import assign_to_centroids, hash_shard
from retrieval.types import DocId, Document
from retrieval.wire import check_finite
from serving.versions.registry import VersionSnapshot
from serving.writes.models import MAX_DOCUMENTS, MAX_TEXT_CHARS, DeleteRequest, DocumentIn, UpsertRequest


@dataclass(slots=True, frozen=True)
class WriteSettings:
    timeout_s: float = 15.0  # how long a write may take, failovers of a primary included (a lease or two)
    attempt_timeout_s: float = 7.0  # one try at one primary (a hung one is given up on, and looked up again)
    max_document_bytes: int = 1 << 20  # largest document (title + text + metadata)
    max_documents: int = MAX_DOCUMENTS  # per upsert or delete request
    max_text_chars: int = MAX_TEXT_CHARS  # of a title or a text
    max_body_bytes: int = 64 << 20  # a write request's body (larger: 413)

    def validate(self) -> None:
        if self.timeout_s <= 0 or self.max_document_bytes <= 0 or self.attempt_timeout_s <= 0:
            raise ConfigError("writes.timeout_s, attempt_timeout_s and max_document_bytes must be > 0",
                              field="writes.timeout_s")
        if not 1 <= self.max_documents <= MAX_DOCUMENTS or not 1 <= self.max_text_chars <= MAX_TEXT_CHARS:
            raise ConfigError(f"writes.max_documents must be 1..{MAX_DOCUMENTS}, max_text_chars 1..{MAX_TEXT_CHARS}",
                              field="writes.max_documents")


@dataclass(slots=True)
class Item:
    """One record to send (the shard's primary gives it its seq)."""

    op: int
    doc_id: str
    title: str = ""
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    vector: np.ndarray | None = None
    moved: bool = False  # kmeans: a delete because the document's home is another shard now

    def record(self, key: str = "", fingerprint: str = "") -> WalRecord:
        return WalRecord(0, self.op, self.doc_id, self.title, self.text, self.metadata, self.vector, key=key,
                         fingerprint=fingerprint, moved=self.moved)


async def vectors_for(documents: Sequence[DocumentIn], snapshot: VersionSnapshot) -> np.ndarray:
    """Each document's vector for ``snapshot``'s version: given (checked), or embedded by its encoder
    (a ``no_vector`` document's row is left zero: :func:`route_upserts` sends it without one)."""
    dim = snapshot.topology.dim
    out = np.zeros((len(documents), dim), dtype=np.float32)
    given = [i for i, d in enumerate(documents) if d.vector is not None]
    to_embed = [i for i, d in enumerate(documents) if d.vector is None and not d.no_vector]
    for i in given:
        size = len(documents[i].vector or ())
        if size != dim:
            raise DimensionMismatch(f"documents[{i}].vector has {size} dims, version {snapshot.version} has {dim}",
                                    field=f"documents[{i}].vector")
    if given:
        # one conversion and one finiteness check for the batch (per row they cost ~2x more)
        rows = np.array([documents[i].vector for i in given], dtype=np.float32)
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            bad = given[int(np.flatnonzero(~finite)[0])]
            check_finite(rows[given.index(bad)], field=f"documents[{bad}].vector")
        out[given] = rows
    if to_embed:
        if snapshot.encoder is None:
            raise ShardUnavailable(f"no encoder for version {snapshot.version}: send vectors", field="documents")
        with tracing.span("encode", **{"shardrag.version": snapshot.version, "shardrag.documents": len(to_embed)}):
            embedded = await snapshot.encoder.encode_documents(
                [Document(DocId(documents[i].id), documents[i].text or "", documents[i].title) for i in to_embed])
        out[to_embed] = embedded
    return out

def shards_holding(doc_id: str, num_shards: int, kmeans: bool) -> list[int]:
    """Where a document may live: its hash shard, or any shard of a kmeans partition."""
    return list(range(num_shards)) if kmeans else [hash_shard(doc_id, num_shards)]

def route_upserts(documents: Sequence[DocumentIn], vectors: np.ndarray,
                  snapshot: VersionSnapshot) -> dict[int, list[Item]]:
    """Per shard, the records of an upsert batch (kmeans: plus a delete on every other shard)."""
    topology = snapshot.topology
    plan: dict[int, list[Item]] = defaultdict(list)
    if topology.centroids is not None:
        bare = next((i for i, d in enumerate(documents) if d.no_vector), None)
        if bare is not None:
            raise InvalidRequest(f"documents[{bare}]: version {snapshot.version} places documents on the shard of "
                                 "their nearest centroid (kmeans), which needs a vector; no_vector is for hash-"
                                 "partitioned collections", field=f"documents[{bare}].no_vector")
    homes = (assign_to_centroids(vectors, topology.centroids).tolist() if topology.centroids is not None
             else [hash_shard(d.id, topology.num_shards) for d in documents])
    for doc, vector, home in zip(documents, vectors, homes, strict=True):
        plan[int(home)].append(Item(UPSERT, doc.id, doc.title, doc.text or "", dict(doc.metadata),
                                    None if doc.no_vector else vector))
        if topology.centroids is not None:  # the id may have lived elsewhere: never found twice
            for other in range(topology.num_shards):
                if other != home:
                    plan[other].append(Item(DELETE, doc.id, moved=True))
    return plan


def request_fingerprint(request: UpsertRequest | DeleteRequest) -> str:
    """What makes two requests under one idempotency key the same request. ``no_vector`` counts only
    where it is set: a request without it fingerprints as it did before the field existed (a retry
    across an upgrade is still the same request)."""
    exclude: dict[str, Any] = {"idempotency_key": True}
    if isinstance(request, UpsertRequest):
        exclude["documents"] = {i: {"no_vector"} for i, d in enumerate(request.documents) if not d.no_vector}
    return hashlib.sha256(request.model_dump_json(exclude=exclude).encode()).hexdigest()
