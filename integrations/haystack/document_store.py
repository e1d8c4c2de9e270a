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
* Every method has its ``*_async`` twin (``async_methods``); what both share is in ``store_base``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haystack.dataclasses import Document
from haystack.document_stores.types import DuplicatePolicy

from integrations.common import ensure_collection
from integrations.haystack.async_methods import AsyncDocumentMethods
from integrations.haystack.filters import to_shardrag
from integrations.haystack.store_base import (
    BATCH,
    check_meta,
    filter_error,
    fused_query,
    hits,
    id_checks,
    listed,
    planned,
    updated_row,
    without_existing,
    written_count,
)
from retrieval.client import ShardragClient
from retrieval.errors import InvalidRequest, NotFound


class ShardragDocumentStore(AsyncDocumentMethods):
    def count_documents(self) -> int:
        return self.count_documents_by_filter({})

    def count_documents_by_filter(self, filters: dict[str, Any]) -> int:
        return int(self._client().count(filter=to_shardrag(filters)))

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """Every document the filters select, in id order, with its embedding (score None)."""
        shardrag_filter = to_shardrag(filters)
        try:
            return [listed(found) for found in self._client().documents(filter=shardrag_filter, with_vectors=True)]
        except InvalidRequest as exc:
            raise filter_error(exc) from exc

    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        given, batch, policy = planned(documents, policy)
        client = self._client()
        if policy != DuplicatePolicy.OVERWRITE:
            existing: set[str] = set()
            for check in id_checks([d.id for d in batch]):
                page = client.scroll(filter=check, limit=len(check["must"][0]["has_id"]))
                existing.update(d["id"] for d in page["documents"])
            batch = without_existing(batch, existing, policy)
        rows = [self.row(d) for d in batch]
        for start in range(0, len(rows), BATCH):
            self.link.floors.note(client.upsert(rows[start:start + BATCH], write_ack=self.write_ack))
        return written_count(given, rows, policy)

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
        check_meta(meta)
        client = self._client()
        rows: list[dict[str, Any]] = []
        updated = 0
        for found in client.documents(filter=to_shardrag(filters), with_vectors=True, page_size=BATCH):
            rows.append(updated_row(found, meta))
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
            with self._admin() as admin:
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
        return self._search(top_k, filters, vector=self.vector(query_embedding))

    def bm25_retrieval(self, query: str, *, filters: dict[str, Any] | None = None,
                       top_k: int = 10) -> list[Document]:
        """The ``top_k`` documents by BM25 over their content (with or without an embedding)."""
        return self._search(top_k, filters, text=query, mode="lexical")

    def hybrid_retrieval(self, query: str, query_embedding: Sequence[float], *,
                         filters: dict[str, Any] | None = None, top_k: int = 10, fusion: str = "rrf",
                         weights: dict[str, float] | None = None, rrf_k: int | None = None) -> list[Document]:
        """BM25 and the embedding together, fused by ``fusion``: ``rrf`` (``rrf_k``, default 60) or
        ``weighted`` (``weights`` per leg, ``{"dense": …, "lexical": …}``; docs/hybrid.md)."""
        return self._search(top_k, filters, **fused_query(query, self.vector(query_embedding), fusion, weights, rrf_k))

    def _search(self, top_k: int, filters: dict[str, Any] | None, **query: Any) -> list[Document]:
        args = self.search_args(top_k, filters, query)
        return [] if args is None else hits(self._client().query(**args))

    def close(self) -> None:
        self.link.close()

    # -- the collection -----------------------------------------------------------------------------
    def _admin(self) -> ShardragClient:
        return self.link.target.root_client()

    def _client(self) -> ShardragClient:
        if not self._ready:
            with self._admin() as admin:
                ensure_collection(admin, self.collection, **self.collection_shape())
            self._ready = True
        return self.link.client
