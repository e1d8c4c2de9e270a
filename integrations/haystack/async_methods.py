"""The async twins of ``ShardragDocumentStore``'s methods (``Pipeline.run_async`` and Haystack's
``*_async`` protocol): the same requests through an ``AsyncShardragClient`` made per call (an
async client belongs to the event loop that made it), the same session floors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haystack.dataclasses import Document
from haystack.document_stores.types import DuplicatePolicy

from integrations.common import ensure_collection_async
from integrations.haystack.filters import to_shardrag
from integrations.haystack.store_base import (
    BATCH,
    StoreBase,
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
from retrieval.errors import InvalidRequest, NotFound


class AsyncDocumentMethods(StoreBase):
    async def _ensure_async(self) -> None:
        if self._ready:
            return

        root = self.link.target
        admin = root.async_root_client()
        try:
            await ensure_collection_async(admin, self.collection, **self.collection_shape())
        finally:
            await admin.close()
        self._ready = True

    async def count_documents_async(self) -> int:
        return await self.count_documents_by_filter_async({})

    async def count_documents_by_filter_async(self, filters: dict[str, Any]) -> int:
        await self._ensure_async()
        async with self.link.async_client() as client:
            return int(await client.count(filter=to_shardrag(filters)))

    async def filter_documents_async(self, filters: dict[str, Any] | None = None) -> list[Document]:
        shardrag_filter = to_shardrag(filters)
        await self._ensure_async()
        async with self.link.async_client() as client:
            try:
                return [listed(found) async for found in client.documents(filter=shardrag_filter, with_vectors=True)]
            except InvalidRequest as exc:
                raise filter_error(exc) from exc

    async def write_documents_async(self, documents: list[Document],
                                    policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        given, batch, policy = planned(documents, policy)
        await self._ensure_async()
        async with self.link.async_client() as client:
            if policy != DuplicatePolicy.OVERWRITE:
                existing: set[str] = set()
                for check in id_checks([d.id for d in batch]):
                    page = await client.scroll(filter=check, limit=len(check["must"][0]["has_id"]))
                    existing.update(d["id"] for d in page["documents"])
                batch = without_existing(batch, existing, policy)
            rows = [self.row(d) for d in batch]
            for start in range(0, len(rows), BATCH):
                self.link.floors.note(await client.upsert(rows[start:start + BATCH], write_ack=self.write_ack))
        return written_count(given, rows, policy)

    async def delete_documents_async(self, document_ids: list[str]) -> None:
        ids = list(dict.fromkeys(i for i in document_ids if i))
        await self._ensure_async()
        async with self.link.async_client() as client:
            for start in range(0, len(ids), BATCH):
                self.link.floors.note(await client.delete(ids[start:start + BATCH], write_ack=self.write_ack))

    async def delete_by_filter_async(self, filters: dict[str, Any]) -> int:
        shardrag_filter = to_shardrag(filters)
        if not shardrag_filter:
            return await self.delete_all_documents_async()
        await self._ensure_async()
        async with self.link.async_client() as client:
            reply = await client.delete(filter=shardrag_filter, write_ack=self.write_ack)
        self.link.floors.note(reply)
        return len(reply.get("ids", []))

    async def update_by_filter_async(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        check_meta(meta)
        await self._ensure_async()
        rows: list[dict[str, Any]] = []
        updated = 0
        async with self.link.async_client() as client:
            async for found in client.documents(filter=to_shardrag(filters), with_vectors=True, page_size=BATCH):
                rows.append(updated_row(found, meta))
                if len(rows) == BATCH:
                    self.link.floors.note(await client.upsert(rows, write_ack=self.write_ack))
                    updated, rows = updated + len(rows), []
            if rows:
                self.link.floors.note(await client.upsert(rows, write_ack=self.write_ack))
                updated += len(rows)
        return updated

    async def delete_all_documents_async(self, recreate_index: bool = False) -> int:
        if recreate_index:

            root = self.link.target
            admin = root.async_root_client()
            try:
                await admin.drop_collection(self.collection)
            except NotFound:
                pass
            finally:
                await admin.close()
            self.link.floors.reset()
            self._ready = False
            await self._ensure_async()
            return -1
        await self._ensure_async()
        deleted = 0
        async with self.link.async_client() as client:
            while True:
                ids = [d["id"] for d in (await client.scroll(limit=BATCH))["documents"]]
                if not ids:
                    return deleted
                self.link.floors.note(await client.delete(ids, write_ack=self.write_ack))
                deleted += len(ids)

    async def search_async(self, top_k: int, filters: dict[str, Any] | None, **query: Any) -> list[Document]:
        """The retrievers' ``run_async``: a query with the store's session floors."""
        args = self.search_args(top_k, filters, query)
        if args is None:
            return []
        await self._ensure_async()
        async with self.link.async_client() as client:
            return hits(await client.query(**args))

    async def embedding_retrieval_async(self, query_embedding: Sequence[float], *,
                                        filters: dict[str, Any] | None = None, top_k: int = 10) -> list[Document]:
        return await self.search_async(top_k, filters, vector=self.vector(query_embedding))

    async def bm25_retrieval_async(self, query: str, *, filters: dict[str, Any] | None = None,
                                   top_k: int = 10) -> list[Document]:
        return await self.search_async(top_k, filters, text=query, mode="lexical")

    async def hybrid_retrieval_async(self, query: str, query_embedding: Sequence[float], *,
                                     filters: dict[str, Any] | None = None, top_k: int = 10, fusion: str = "rrf",
                                     weights: dict[str, float] | None = None,
                                     rrf_k: int | None = None) -> list[Document]:
        return await self.search_async(top_k, filters, **fused_query(query, self.vector(query_embedding), fusion,
                                                                    weights, rrf_k))
