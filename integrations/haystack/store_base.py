"""What ``ShardragDocumentStore``'s sync and async methods share: the settings, the collection's
shape, a Haystack ``Document`` as a shardrag document and back, write policies, search arguments.
No I/O here: the methods that call the cluster live in ``document_store`` (sync) and
``async_methods`` (async), each a thin layer over these."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from haystack import default_from_dict, default_to_dict
from haystack.dataclasses import Document
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack.errors import FilterError

from integrations.common import CollectionLink, StoreTarget, prepared_vectors
from integrations.haystack.filters import to_shardrag
from integrations.lists import id_chunks
from retrieval.errors import InvalidRequest

BATCH = 500  # documents per write request (the gateway takes up to 1,000)
DISTANCES = ("dot_product", "cosine", "l2")


class StoreBase:
    def __init__(self, *, url: str, collection: str, embedding_dim: int = 768, distance: str = "dot_product",
                 api_key: str | None = None, shards: int = 1, replicas: int = 1, factory: str = "Flat",
                 write_ack: str = "majority", timeout_s: float = 30.0, lexical_language: str | None = None,
                 retries: int = 0) -> None:
        if distance not in DISTANCES:
            raise ValueError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
        self.url, self.collection, self.embedding_dim, self.distance = url, collection, embedding_dim, distance
        self.api_key, self.shards, self.replicas, self.factory = api_key, shards, replicas, factory
        self.write_ack, self.timeout_s, self.retries = write_ack, timeout_s, retries
        self.lexical_language = lexical_language  # a collection it creates (None: english)
        self.link = CollectionLink(StoreTarget(url, collection, api_key, timeout_s, retries))
        self._ready = False  # the collection is known to exist (made on first use)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, url=self.url, collection=self.collection, embedding_dim=self.embedding_dim,
                               distance=self.distance, shards=self.shards, replicas=self.replicas,
                               factory=self.factory, write_ack=self.write_ack, timeout_s=self.timeout_s,
                               lexical_language=self.lexical_language, retries=self.retries)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        return default_from_dict(cls, data)

    def collection_shape(self) -> dict[str, Any]:
        """``ensure_collection``'s arguments: dot product is the ``ip`` metric on vectors as given."""
        return {"dim": self.embedding_dim, "distance": "l2" if self.distance == "l2" else "cosine",
                "shards": self.shards, "replicas": self.replicas, "factory": self.factory,
                "lexical_language": self.lexical_language}

    def vector(self, embedding: Sequence[float]) -> list[float]:
        """An embedding as the collection stores it (unit length for cosine, else as given)."""
        if len(embedding) != self.embedding_dim:
            raise ValueError(f"an embedding of {len(embedding)} dimensions; this store holds {self.embedding_dim}")
        return prepared_vectors([embedding], "cosine" if self.distance == "cosine" else "l2")[0]

    def row(self, document: Document) -> dict[str, Any]:
        """A Document as a write's document; one without an embedding is kept without a vector
        (filters, listings and BM25 find it, embedding retrieval does not)."""
        if document.blob is not None or document.sparse_embedding is not None:
            raise ValueError(f"document {document.id!r}: shardrag stores content, meta and a dense embedding; not "
                             "blobs or sparse embeddings")
        row: dict[str, Any] = {"id": document.id, "metadata": dict(document.meta)}
        if document.content is not None:
            row["text"] = document.content
        if document.embedding is not None:
            row["vector"] = self.vector(document.embedding)
        else:
            row["no_vector"] = True
        return row

    def search_args(self, top_k: int, filters: dict[str, Any] | None, query: dict[str, Any]) -> dict[str, Any] | None:
        """A query's arguments with the store's session floors (None: ``top_k`` 0 asks for nothing)."""
        if top_k < 0:
            raise ValueError(f"top_k must be ≥ 0, got {top_k}")
        if top_k == 0:
            return None
        shardrag_filter = to_shardrag(filters)
        if shardrag_filter:
            query["filter"] = shardrag_filter
        return {"k": top_k, "with_metadata": True, **query, **self.link.floors.query_args()}


def fused_query(text: str, vector: list[float], fusion: str, weights: dict[str, float] | None,
                rrf_k: int | None) -> dict[str, Any]:
    """A hybrid query's arguments; ``weights`` go with ``weighted`` and ``rrf_k`` with ``rrf`` (the
    gateway refuses either with the other fusion, naming it)."""
    query: dict[str, Any] = {"text": text, "vector": vector, "mode": "hybrid", "fusion": fusion}
    if weights is not None:
        query["weights"] = weights
    if rrf_k is not None:
        query["rrf_k"] = rrf_k
    return query


def planned(documents: Any, policy: DuplicatePolicy) -> tuple[list[Document], list[Document], DuplicatePolicy]:
    """The documents given (checked), one per id to write, and the policy (NONE is FAIL)."""
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Iterable):
        raise ValueError("write_documents takes a list of Documents")
    given = list(documents)
    if not all(isinstance(d, Document) for d in given):
        raise ValueError("write_documents takes a list of Documents")
    if policy == DuplicatePolicy.NONE:
        policy = DuplicatePolicy.FAIL
    by_id: dict[str, Document] = {}  # a repeated id: a duplicate (FAIL), the first (SKIP) or the last (OVERWRITE)
    for document in given:
        if document.id in by_id:
            if policy == DuplicatePolicy.FAIL:
                raise DuplicateDocumentError(f"id {document.id!r} is given twice")
            if policy == DuplicatePolicy.SKIP:
                continue
        by_id[document.id] = document
    return given, list(by_id.values()), policy


def without_existing(batch: list[Document], existing: set[str], policy: DuplicatePolicy) -> list[Document]:
    if existing and policy == DuplicatePolicy.FAIL:
        raise DuplicateDocumentError(f"documents with these ids exist already: {sorted(existing)[:10]}")
    return [d for d in batch if d.id not in existing]


def written_count(given: list[Document], rows: list[dict[str, Any]], policy: DuplicatePolicy) -> int:
    # OVERWRITE counts every document given (an id given twice was written twice, the last stays)
    return len(given) if policy == DuplicatePolicy.OVERWRITE else len(rows)


def id_checks(ids: Sequence[str]) -> list[dict[str, Any]]:
    """The listing filters that find which of ``ids`` exist, in chunks a ``has_id`` list holds."""
    return [{"must": [{"has_id": chunk}]} for chunk in id_chunks(ids)]


def updated_row(found: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """A listed document written back with ``meta`` merged in (its content and vector kept)."""
    row: dict[str, Any] = {"id": found["id"], "title": found.get("title") or "",
                           "metadata": {**(found.get("metadata") or {}), **meta}}
    if found.get("text"):
        row["text"] = found["text"]
    if found.get("vector") is not None:
        row["vector"] = found["vector"]
    else:
        row["no_vector"] = True
    return row


def check_meta(meta: Any) -> None:
    if not isinstance(meta, dict) or not meta:
        raise ValueError("meta must be a non-empty dictionary of the fields to set")


def listed(found: dict[str, Any]) -> Document:
    return Document(id=found["id"], content=found.get("text") or None, meta=dict(found.get("metadata") or {}),
                    embedding=found.get("vector"))


def hits(reply: dict[str, Any]) -> list[Document]:
    return [Document(id=hit["doc_id"], content=hit.get("text") or None, meta=dict(hit.get("metadata") or {}),
                     score=float(hit["score"])) for hit in reply["hits"]]


def filter_error(exc: InvalidRequest) -> FilterError:
    """What the gateway refuses in a filter (too deep, too many values), as Haystack's error."""
    return FilterError(f"shardrag cannot run this filter: {exc.message}")
