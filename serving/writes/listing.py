"""Listing a collection's documents: pages in id order across every shard, with the count.

``POST /v1/collections/{name}/documents/scroll`` (Qdrant's scroll, Chroma's get): each shard's
most up-to-date reachable replica — its primary first, which holds every acknowledged write, so
a client reads its own writes — lists the live documents the filter selects after the cursor
(``ShardClient.scan``); the shards' pages merge by id and the first ``limit`` are the page. The
cursor is the last id of the page: a page is a range of ids, so documents written or deleted
between two pages are listed or not by their id alone, never twice. ``count`` is the number of
documents the filter selects across the shards at that moment (``limit: 0`` asks for it alone).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Any

from retrieval.errors import ShardragError, ShardUnavailable
from retrieval.filters import parse_filter
from retrieval.records import ScanPage
from serving.writes.models import ScrollRequest
from serving.writes.service import WriteService

logger = logging.getLogger(__name__)


async def _page(service: WriteService, shard: int, version: str, filter_canonical: str, after: str,
                limit: int) -> ScanPage:
    for replica in service.primary_first(shard):
        try:
            return await service.client.scan(replica, shard, version, filter_canonical, after, limit,
                                              service.settings.timeout_s)
        except ShardragError as exc:
            logger.info("listing shard %d on %s: %s", shard, replica, exc.message)
    raise ShardUnavailable(f"no replica of shard {shard} could list its documents", shard=shard)


async def scroll(service: WriteService, request: ScrollRequest) -> dict[str, Any]:
    """The page ``request`` asks for: documents (id, title, text, metadata, seq, shard[, vector]),
    ``count``, ``next_offset`` (None on the last page) and the version listed."""
    filter_canonical = parse_filter(request.filter or {}).canonical()
    version = service.registry.view.state.active
    shards = range(len(service.registry.shard_replicas))
    # one more than the page: whether another page follows is known without a call for it
    want = request.limit + 1 if request.limit else 0
    pages = await asyncio.gather(*(_page(service, s, version, filter_canonical, request.offset or "", want)
                                   for s in shards))
    rows = heapq.merge(*([(r.doc_id, shard, r) for r in page.records] for shard, page in zip(shards, pages,
                                                                                                strict=True)))
    documents: list[dict[str, Any]] = []
    more = False
    for doc_id, shard, record in rows:
        if len(documents) == request.limit:
            more = True
            break
        document: dict[str, Any] = {"id": doc_id, "title": record.title, "text": record.text,
                                    "metadata": record.metadata, "seq": record.seq, "shard": shard}
        if request.with_vectors and record.vector is not None:
            document["vector"] = record.vector.tolist()
        documents.append(document)
    return {"documents": documents, "count": sum(page.matches for page in pages),
            "next_offset": documents[-1]["id"] if more else None, "version": version}
