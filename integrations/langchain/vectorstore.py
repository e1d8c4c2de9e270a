"""``ShardragVectorStore``: a LangChain ``VectorStore`` over one shardrag collection.

    from integrations.langchain import ShardragVectorStore

    store = ShardragVectorStore.create(embedding, url="http://127.0.0.1:8000", collection="docs")
    store.add_documents([Document(page_content="glaciers carve fjords", metadata={"kind": "geo"})])
    store.similarity_search("how are fjords formed", k=4, filter={"kind": "geo"})
    store.similarity_search("fjords", k=4, mode="hybrid")          # BM25 beside the vectors, fused

LangChain embeds on its side (the store's ``embedding``); shardrag keeps each passage's vector,
text and metadata (a write with both ``vector`` and ``text``). Every read after a write of this
store is a *session read*: it carries the seqs and terms the writes got, so a replica that has
not applied them does not answer (read-your-writes on any number of replicas and gateways).

Scores: ``distance="cosine"`` (the default) normalizes every vector and scores by cosine
similarity (−1…1, relevance (1 + s) / 2); ``"l2"`` scores by −L2² (relevance
1 − L2 / √2, LangChain's convention for unit vectors).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from integrations.common import (
    DISTANCES,
    CollectionLink,
    StoreTarget,
    ensure_collection,
    ensure_collection_async,
    prepared_vectors,
)
from integrations.langchain.filters import to_shardrag
from integrations.lists import aread_by_ids, read_by_ids
from retrieval.client import AsyncShardragClient, ShardragClient

MAX_BATCH = 1000  # documents per write request (the gateway's limit)


class ShardragVectorStore(VectorStore):
    def __init__(self, embedding: Embeddings, *, url: str, collection: str, distance: str = "cosine",
                 api_key: str | None = None, timeout_s: float = 30.0, write_ack: str = "majority",
                 retries: int = 0) -> None:
        """A store over the existing collection ``collection`` of the gateway at ``url`` (see
        :meth:`create` to make it). ``write_ack``: replicas that must hold a write before it returns;
        ``retries``: how many more times a request is sent where that is safe (the client's)."""
        if distance not in DISTANCES:
            raise ValueError(f"distance must be one of {sorted(DISTANCES)}, got {distance!r}")
        self._embedding = embedding
        self.link = CollectionLink(StoreTarget(url, collection, api_key, timeout_s, retries))
        self.target, self.floors = self.link.target, self.link.floors
        self.distance = distance
        self.write_ack = write_ack

    # -- making one ------------------------------------------------------------------------------
    @classmethod
    def create(cls, embedding: Embeddings, *, url: str, collection: str, distance: str = "cosine",
               shards: int = 1, replicas: int = 1, factory: str = "Flat", api_key: str | None = None,
               timeout_s: float = 30.0, write_ack: str = "majority",
               lexical_language: str | None = None, retries: int = 0) -> ShardragVectorStore:
        """The store over ``collection``, created (of the embedding's dimension, its texts analysed
        for lexical search in ``lexical_language``, default english) when it does not exist; an
        existing one must have that dimension and metric."""
        dim = len(embedding.embed_query("dimension probe"))
        with ShardragClient(url, api_key=api_key, timeout_s=timeout_s, retries=retries) as admin:
            ensure_collection(admin, collection, dim=dim, distance=distance, shards=shards, replicas=replicas,
                              factory=factory, lexical_language=lexical_language)
        return cls(embedding, url=url, collection=collection, distance=distance, api_key=api_key,
                   timeout_s=timeout_s, write_ack=write_ack, retries=retries)

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings, metadatas: list[dict[str, Any]] | None = None,
                   *, ids: list[str] | None = None, url: str = "http://127.0.0.1:8000",
                   collection: str = "langchain", **kwargs: Any) -> ShardragVectorStore:
        store = cls.create(embedding, url=url, collection=collection, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings,
                          metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                          url: str = "http://127.0.0.1:8000", collection: str = "langchain",
                          **kwargs: Any) -> ShardragVectorStore:
        dim = len(await embedding.aembed_query("dimension probe"))
        async with AsyncShardragClient(url, api_key=kwargs.get("api_key"), timeout_s=kwargs.get("timeout_s", 30.0),
                                       retries=kwargs.get("retries", 0)) as admin:
            await ensure_collection_async(admin, collection, dim=dim, distance=kwargs.get("distance", "cosine"),
                                          shards=kwargs.get("shards", 1), replicas=kwargs.get("replicas", 1),
                                          factory=kwargs.get("factory", "Flat"),
                                          lexical_language=kwargs.get("lexical_language"))
        keep = {k: v for k, v in kwargs.items() if k in ("distance", "api_key", "timeout_s", "write_ack", "retries")}
        store = cls(embedding, url=url, collection=collection, **keep)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store

    @property
    def embeddings(self) -> Embeddings:
        return self._embedding

    @property
    def client(self) -> ShardragClient:
        """The sync client on this store's collection (made on first use; :meth:`close` closes it)."""
        return self.link.client

    def close(self) -> None:
        self.link.close()

    # -- writes ----------------------------------------------------------------------------------
    def add_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        texts = list(texts)
        vectors = self._embedding.embed_documents(texts) if texts else []
        batches, chosen = self._documents(texts, vectors, metadatas, ids)
        for batch in batches:
            self.floors.note(self.client.upsert(batch, write_ack=self.write_ack))
        return chosen

    async def aadd_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
                         ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        texts = list(texts)
        vectors = await self._embedding.aembed_documents(texts) if texts else []
        batches, chosen = self._documents(texts, vectors, metadatas, ids)
        async with self.target.async_client() as client:
            for batch in batches:
                self.floors.note(await client.upsert(batch, write_ack=self.write_ack))
        return chosen

    def _documents(self, texts: list[str], vectors: Sequence[Sequence[float]],
                   metadatas: list[dict[str, Any]] | None,
                   ids: Sequence[str | None] | None) -> tuple[list[list[dict[str, Any]]], list[str]]:
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"{len(metadatas)} metadatas for {len(texts)} texts")
        if ids is not None and len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        chosen = [given or str(uuid.uuid4()) for given in (ids or [None] * len(texts))]
        rows = prepared_vectors(vectors, self.distance)
        documents = []
        for i, (doc_id, text, vector) in enumerate(zip(chosen, texts, rows, strict=True)):
            document: dict[str, Any] = {"id": doc_id, "vector": vector,
                                        "metadata": dict(metadatas[i]) if metadatas else {}}
            if text.strip():  # a blank passage is kept as "" (the API refuses blank text)
                document["text"] = text
            documents.append(document)
        return [documents[i:i + MAX_BATCH] for i in range(0, len(documents), MAX_BATCH)], chosen

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete ``ids`` (absent ones are ignored); ``ids=None`` with ``filter=`` deletes what it selects."""
        for body in _delete_batches(ids, kwargs.get("filter")):
            self.floors.note(self.client.delete(write_ack=self.write_ack, **body))
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        async with self.target.async_client() as client:
            for body in _delete_batches(ids, kwargs.get("filter")):
                self.floors.note(await client.delete(write_ack=self.write_ack, **body))
        return True

    # -- reads -----------------------------------------------------------------------------------
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents of ``ids`` that exist, in that order (a listing, a thousand ids a request)."""
        return [_document(found) for found in read_by_ids(self.client, ids)]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        async with self.target.async_client() as client:
            return [_document(found) for found in await aread_by_ids(client, ids)]

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, **kwargs)]

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, **kwargs: Any) -> list[tuple[Document, float]]:
        """``filter``: a shardrag filter (docs/filters.md), ``{key: value}`` pairs that must all
        match, or the ``$eq`` / ``$gt`` / ``$in`` / ``$and`` … operators other LangChain stores take
        (``integrations.langchain.filters``); ``mode``: ``dense`` (default), ``hybrid`` (BM25 on
        ``query`` fused with the vectors; ``fusion``, ``weights``, ``rrf_k``, ``candidates`` as on
        /v1/query) or ``lexical``; ``group_by`` (a metadata key) and ``group_size``: the best
        ``group_size`` passages (default 1) of each of the ``k`` best groups sharing its value, group
        after group (docs/filters.md)."""
        vector = self._embedding.embed_query(query) if kwargs.get("mode", "dense") != "lexical" else None
        return self._hits(self.client.query(**self._query(query, vector, k, kwargs)))

    async def asimilarity_search_with_score(self, query: str, k: int = 4,
                                            **kwargs: Any) -> list[tuple[Document, float]]:
        mode = kwargs.get("mode", "dense")
        vector = await self._embedding.aembed_query(query) if mode != "lexical" else None
        async with self.target.async_client() as client:
            return self._hits(await client.query(**self._query(query, vector, k, kwargs)))

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self._hits(self.client.query(**self._query(None, embedding, k, kwargs)))]

    async def asimilarity_search_by_vector(self, embedding: list[float], k: int = 4,
                                           **kwargs: Any) -> list[Document]:
        async with self.target.async_client() as client:
            reply = await client.query(**self._query(None, embedding, k, kwargs))
        return [doc for doc, _ in self._hits(reply)]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      **kwargs: Any) -> list[Document]:
        """``k`` of the ``fetch_k`` nearest passages, each chosen for its similarity to ``query``
        less its likeness to those already chosen (LangChain's ``maximal_marginal_relevance``,
        ``lambda_mult``: 1 relevance alone, 0 diversity alone); ``filter`` as in a search."""
        return self.max_marginal_relevance_search_by_vector(self._embedding.embed_query(query), k, fetch_k,
                                                            lambda_mult, **kwargs)

    async def amax_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                             lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        return await self.amax_marginal_relevance_search_by_vector(await self._embedding.aembed_query(query), k,
                                                                   fetch_k, lambda_mult, **kwargs)

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        """The candidates are the dense leg's ``fetch_k`` hits, their vectors read back by id (a
        listing on each shard's primary: one request per thousand)."""
        reply = self.client.query(**self._query(None, embedding, _fetch(k, fetch_k), _dense(kwargs)))
        found = read_by_ids(self.client, [hit["doc_id"] for hit in reply["hits"]], with_vectors=True)
        return _diverse(embedding, self._hits(reply), found, k, lambda_mult)

    async def amax_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                       lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        async with self.target.async_client() as client:
            reply = await client.query(**self._query(None, embedding, _fetch(k, fetch_k), _dense(kwargs)))
            found = await aread_by_ids(client, [hit["doc_id"] for hit in reply["hits"]], with_vectors=True)
        return _diverse(embedding, self._hits(reply), found, k, lambda_mult)

    def _query(self, text: str | None, vector: Sequence[float] | None, k: int,
               options: dict[str, Any]) -> dict[str, Any]:
        mode = options.get("mode", "dense")
        args: dict[str, Any] = {"k": k, "with_metadata": True, "mode": mode, **self.floors.query_args()}
        if vector is not None:
            args["vector"] = prepared_vectors([vector], self.distance)[0]
        if mode != "dense":
            if not text:
                raise ValueError(f"mode {mode!r} needs the query's text")
            args["text"] = text
        if options.get("filter") is not None:
            args["filter"] = to_shardrag(options["filter"])
        for name in ("fusion", "weights", "rrf_k", "candidates", "ef_search", "nprobe", "timeout_ms", "group_by",
                     "group_size"):
            if options.get(name) is not None:
                args[name] = options[name]
        return args

    def _hits(self, reply: dict[str, Any]) -> list[tuple[Document, float]]:
        return [(Document(id=hit["doc_id"], page_content=hit.get("text") or "",
                          metadata=dict(hit.get("metadata") or {})), float(hit["score"]))
                for hit in reply["hits"]]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        if self.distance == "l2":
            return lambda score: 1.0 - math.sqrt(max(-score, 0.0)) / math.sqrt(2)
        return lambda score: (1.0 + score) / 2.0


def _fetch(k: int, fetch_k: int) -> int:
    if k < 1 or fetch_k < 1:
        raise ValueError(f"k and fetch_k must be at least 1, got {k} and {fetch_k}")
    return max(k, fetch_k)


def _dense(options: dict[str, Any]) -> dict[str, Any]:
    """A search's options for an MMR's candidates: they are the dense leg's (MMR weighs vectors)."""
    if options.get("mode", "dense") != "dense":
        raise ValueError(f"max marginal relevance re-ranks the dense leg's hits; mode {options['mode']!r} is not "
                         "taken here (use similarity_search for lexical or hybrid)")
    return options


def _diverse(query: Sequence[float], hits: list[tuple[Document, float]], found: list[dict[str, Any]], k: int,
             lambda_mult: float) -> list[Document]:
    """MMR over the hits whose vectors were read back (a passage deleted in between is left out)."""
    vectors = {document["id"]: document["vector"] for document in found if document.get("vector") is not None}
    candidates = [doc for doc, _ in hits if doc.id in vectors]
    if not candidates:
        return []
    chosen = maximal_marginal_relevance(np.asarray(query, dtype=np.float64), [vectors[d.id] for d in candidates],
                                        lambda_mult=lambda_mult, k=k)
    return [candidates[i] for i in chosen]


def _document(found: dict[str, Any]) -> Document:
    return Document(id=found["id"], page_content=found.get("text") or "", metadata=dict(found.get("metadata") or {}))


def _delete_batches(ids: list[str] | None, filter_: Any) -> list[dict[str, Any]]:
    if ids is None:
        if filter_ is None:
            raise ValueError("delete needs ids, or filter= to delete what the filter selects")
        return [{"filter": to_shardrag(filter_)}]
    unique = list(dict.fromkeys(ids))  # the API takes one write per id per request
    return [{"ids": unique[i:i + MAX_BATCH]} for i in range(0, len(unique), MAX_BATCH)]


__all__ = ["ShardragVectorStore"]
