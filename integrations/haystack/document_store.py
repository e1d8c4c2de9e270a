"""``ShardragDocumentStore``: a Haystack ``DocumentStore`` over one shardrag collection.

A Haystack ``Document`` is a shardrag document: its ``id``, its ``content`` as the text (BM25
works on it), its ``meta`` as metadata (flat: strings, numbers, booleans, lists of strings), its
``embedding`` as the vector — kept exactly as given (``dot_product`` and ``l2`` store it as it
is; ``cosine`` stores it at unit length); a document without an embedding is stored without a
vector (``no_vector``: BM25 and filters find it, embedding retrieval does not). The collection is made on first use at
``embedding_dim`` unless it exists (then its dimension and metric must match).

* ``write_documents`` with a policy: ``FAIL`` (and ``NONE``) checks the ids first and writes
  nothing when one exists; ``SKIP`` writes the new ones; ``OVERWRITE`` upserts. The check and the
  write are two requests: two writers racing on one new id may both pass the check (the last
  write wins, as with ``OVERWRITE``).
* ``filter_documents`` lists the collection in id order through its filter (Haystack's syntax,
  ``integrations.haystack.filters``), with every document's embedding; ``count_documents`` is
  exact. Both read each shard's primary: the store's own writes are always there.
* The retrievers (``integrations.haystack.retrievers``) search with the session floors of the
  store's writes, so any replica that answers holds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from haystack import default_from_dict, default_to_dict
from haystack.dataclasses import Document
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack.errors import FilterError

from integrations.common import CollectionLink, StoreTarget, ensure_collection, prepared_vectors
from integrations.haystack.filters import to_shardrag
from retrieval.errors import InvalidRequest

BATCH = 500  # documents per write request (the gateway takes up to 1,000)
ID_CHECK = 1000  # ids per existence check (a has_id list holds up to 1,024)
DISTANCES = ("dot_product", "cosine", "l2")


class ShardragDocumentStore:
    def __init__(self, *, url: str, collection: str, embedding_dim: int = 768, distance: str = "dot_product",
                 api_key: str | None = None, shards: int = 1, replicas: int = 1, factory: str = "Flat",
                 write_ack: str = "majority", timeout_s: float = 30.0) -> None:
        if distance not in DISTANCES:
            raise ValueError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
        self.url, self.collection, self.embedding_dim, self.distance = url, collection, embedding_dim, distance
        self.api_key, self.shards, self.replicas, self.factory = api_key, shards, replicas, factory
        self.write_ack, self.timeout_s = write_ack, timeout_s
        self.link = CollectionLink(StoreTarget(url, collection, api_key, timeout_s))
        self._ready = False

    # -- Haystack's protocol --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, url=self.url, collection=self.collection, embedding_dim=self.embedding_dim,
                               distance=self.distance, shards=self.shards, replicas=self.replicas,
                               factory=self.factory, write_ack=self.write_ack, timeout_s=self.timeout_s)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardragDocumentStore:
        store: ShardragDocumentStore = default_from_dict(cls, data)
        return store

    def count_documents(self) -> int:
        return self.count_documents_by_filter({})

    def count_documents_by_filter(self, filters: dict[str, Any]) -> int:
        return int(self._client().count(filter=to_shardrag(filters)))

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """Every document the filters select, in id order, with its embedding (score None)."""
        shardrag_filter = to_shardrag(filters)
        try:
            return [_document(found) for found in self._client().documents(filter=shardrag_filter, with_vectors=True)]
        except InvalidRequest as exc:  # what the gateway refuses in a filter (too deep, too many values)
            raise FilterError(f"shardrag cannot run this filter: {exc.message}") from exc

    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        if isinstance(documents, (str, bytes)) or not isinstance(documents, Iterable):
            raise ValueError("write_documents takes a list of Documents")
        documents = list(documents)
        if not all(isinstance(d, Document) for d in documents):
            raise ValueError("write_documents takes a list of Documents")
        if policy == DuplicatePolicy.NONE:
            policy = DuplicatePolicy.FAIL
        batch = _one_per_id(documents, policy)
        if policy != DuplicatePolicy.OVERWRITE:
            existing = self._existing([d.id for d in batch])
            if existing and policy == DuplicatePolicy.FAIL:
                raise DuplicateDocumentError(f"documents with these ids exist already: {sorted(existing)[:10]}")
            batch = [d for d in batch if d.id not in existing]
        rows = [self._row(d) for d in batch]
        client = self._client()
        for start in range(0, len(rows), BATCH):
            self.link.floors.note(client.upsert(rows[start:start + BATCH], write_ack=self.write_ack))
        # OVERWRITE counts every document given (an id given twice was written twice, the last stays)
        return len(documents) if policy == DuplicatePolicy.OVERWRITE else len(rows)

    def delete_documents(self, document_ids: list[str]) -> None:
        """Delete these ids (an id that is not there is no error)."""
        ids = list(dict.fromkeys(i for i in document_ids if i))
        client = self._client()
        for start in range(0, len(ids), BATCH):
            self.link.floors.note(client.delete(ids[start:start + BATCH], write_ack=self.write_ack))

    def delete_by_filter(self, filters: dict[str, Any]) -> int:
        """Delete every document the filters select; how many were deleted."""
        shardrag_filter = to_shardrag(filters)
        if not shardrag_filter:
            return self.delete_all_documents()
        reply = self._client().delete(filter=shardrag_filter, write_ack=self.write_ack)
        self.link.floors.note(reply)
        return len(reply.get("ids", []))

    def update_by_filter(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        """Merge ``meta`` into the metadata of every document the filters select (their content and
        embeddings kept); how many were updated. Documents are read a page at a time and written
        back: a write to one of them in between is overwritten by the merge."""
        if not isinstance(meta, dict) or not meta:
            raise ValueError("meta must be a non-empty dictionary of the fields to set")
        client = self._client()
        rows: list[dict[str, Any]] = []
        updated = 0
        for found in client.documents(filter=to_shardrag(filters), with_vectors=True, page_size=BATCH):
            row: dict[str, Any] = {"id": found["id"], "title": found.get("title") or "",
                                   "metadata": {**(found.get("metadata") or {}), **meta}}
            if found.get("text"):
                row["text"] = found["text"]
            if found.get("vector") is not None:
                row["vector"] = found["vector"]
            else:
                row["no_vector"] = True
            rows.append(row)
            if len(rows) == BATCH:
                self.link.floors.note(client.upsert(rows, write_ack=self.write_ack))
                updated, rows = updated + len(rows), []
        if rows:
            self.link.floors.note(client.upsert(rows, write_ack=self.write_ack))
            updated += len(rows)
        return updated

    def delete_all_documents(self, recreate_index: bool = False) -> int:
        """Empty the collection, page by page by id; how many were deleted. ``recreate_index``: drop
        the collection and make it anew instead (an admin key; its documents are not counted: -1)."""
        if recreate_index:
            from retrieval.client import ShardragClient
            from retrieval.errors import NotFound

            root = self.link.target
            with ShardragClient(root.url, api_key=root.api_key, timeout_s=root.timeout_s) as admin:
                try:
                    admin.drop_collection(self.collection)
                except NotFound:
                    pass
            self.link.floors.reset()
            self._ready = False
            self._client()
            return -1
        client = self._client()
        deleted = 0
        while True:
            ids = [d["id"] for d in client.scroll(limit=BATCH)["documents"]]
            if not ids:
                return deleted
            self.link.floors.note(client.delete(ids, write_ack=self.write_ack))
            deleted += len(ids)

    # -- retrieval (the retrievers call these) -----------------------------------------------------
    def embedding_retrieval(self, query_embedding: Sequence[float], *, filters: dict[str, Any] | None = None,
                            top_k: int = 10) -> list[Document]:
        """The ``top_k`` documents nearest ``query_embedding`` (documents without one never come)."""
        if len(query_embedding) != self.embedding_dim:
            raise ValueError(f"the query embedding has {len(query_embedding)} dimensions; this store holds "
                             f"{self.embedding_dim}")
        vector = prepared_vectors([query_embedding], "cosine" if self.distance == "cosine" else "l2")[0]
        return self._search(top_k, filters, vector=vector)

    def bm25_retrieval(self, query: str, *, filters: dict[str, Any] | None = None,
                       top_k: int = 10) -> list[Document]:
        """The ``top_k`` documents by BM25 over their content (with or without an embedding)."""
        return self._search(top_k, filters, text=query, mode="lexical")

    def hybrid_retrieval(self, query: str, query_embedding: Sequence[float], *,
                         filters: dict[str, Any] | None = None, top_k: int = 10,
                         fusion: str = "rrf") -> list[Document]:
        """BM25 and the embedding together, fused by ``fusion`` (``rrf`` or ``weighted``; docs/hybrid.md)."""
        vector = prepared_vectors([query_embedding], "cosine" if self.distance == "cosine" else "l2")[0]
        return self._search(top_k, filters, text=query, vector=vector, mode="hybrid", fusion=fusion)

    def _search(self, top_k: int, filters: dict[str, Any] | None, **query: Any) -> list[Document]:
        if top_k < 0:
            raise ValueError(f"top_k must be ≥ 0, got {top_k}")
        if top_k == 0:
            return []
        shardrag_filter = to_shardrag(filters)
        if shardrag_filter:
            query["filter"] = shardrag_filter
        reply = self._client().query(k=top_k, with_metadata=True, **query, **self.link.floors.query_args())
        return [Document(id=hit["doc_id"], content=hit.get("text") or None, meta=dict(hit.get("metadata") or {}),
                         score=float(hit["score"])) for hit in reply["hits"]]

    def close(self) -> None:
        self.link.close()

    # -- the collection -----------------------------------------------------------------------------
    def _client(self) -> Any:
        if not self._ready:
            root = self.link.target
            from retrieval.client import ShardragClient

            with ShardragClient(root.url, api_key=root.api_key, timeout_s=root.timeout_s) as admin:
                ensure_collection(admin, self.collection, dim=self.embedding_dim,
                                  distance="l2" if self.distance == "l2" else "cosine", shards=self.shards,
                                  replicas=self.replicas, factory=self.factory)
            self._ready = True
        return self.link.client

    def _existing(self, ids: Sequence[str]) -> set[str]:
        client = self._client()
        found: set[str] = set()
        for start in range(0, len(ids), ID_CHECK):
            chunk = list(ids[start:start + ID_CHECK])
            page = client.scroll(filter={"must": [{"has_id": chunk}]}, limit=len(chunk))
            found.update(d["id"] for d in page["documents"])
        return found

    def _row(self, document: Document) -> dict[str, Any]:
        if document.blob is not None or document.sparse_embedding is not None:
            raise ValueError(f"document {document.id!r}: shardrag stores content, meta and a dense embedding; not "
                             "blobs or sparse embeddings")
        row: dict[str, Any] = {"id": document.id, "metadata": dict(document.meta)}
        if document.content is not None:
            row["text"] = document.content
        if document.embedding is not None:
            if len(document.embedding) != self.embedding_dim:
                raise ValueError(f"document {document.id!r} has a {len(document.embedding)}-dimensional embedding; "
                                 f"this store holds {self.embedding_dim} dimensions")
            row["vector"] = prepared_vectors([document.embedding], "cosine" if self.distance == "cosine" else "l2")[0]
        else:  # kept without a vector: filters, listings and BM25 find it, embedding retrieval does not
            row["no_vector"] = True
        return row


def _one_per_id(documents: list[Document], policy: DuplicatePolicy) -> list[Document]:
    """One document per id: a repeated id in one call is a duplicate (FAIL), the first (SKIP) or the last
    (OVERWRITE)."""
    by_id: dict[str, Document] = {}
    for document in documents:
        if document.id in by_id:
            if policy == DuplicatePolicy.FAIL:
                raise DuplicateDocumentError(f"id {document.id!r} is given twice")
            if policy == DuplicatePolicy.SKIP:
                continue
        by_id[document.id] = document
    return list(by_id.values())


def _document(found: dict[str, Any]) -> Document:
    return Document(id=found["id"], content=found.get("text") or None, meta=dict(found.get("metadata") or {}),
                    embedding=found.get("vector"))



