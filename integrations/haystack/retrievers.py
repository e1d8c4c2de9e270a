"""Haystack components that retrieve from a ``ShardragDocumentStore``: by embedding, by BM25, or both.

Each has ``run`` and ``run_async`` (``Pipeline.run_async``), and takes the store, default
``filters`` and ``top_k``, and a ``filter_policy`` (Haystack's:
``replace`` the defaults with the run's filters, or ``merge`` them); its documents carry the
score shardrag gave them. Reads carry the session floors of the store's writes: a replica that
answers holds every document the store wrote.
"""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.document_stores.types import FilterPolicy, apply_filter_policy

from integrations.haystack.document_store import ShardragDocumentStore


class _Retriever:
    def __init__(self, *, document_store: ShardragDocumentStore, filters: dict[str, Any] | None = None,
                 top_k: int = 10, filter_policy: str | FilterPolicy = FilterPolicy.REPLACE) -> None:
        if not isinstance(document_store, ShardragDocumentStore):
            raise ValueError(f"document_store must be a ShardragDocumentStore, got {type(document_store).__name__}")
        if top_k < 0:
            raise ValueError(f"top_k must be ≥ 0, got {top_k}")
        self.document_store, self.filters, self.top_k = document_store, filters or {}, top_k
        self.filter_policy = FilterPolicy.from_str(filter_policy) if isinstance(filter_policy, str) else filter_policy

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, document_store=self.document_store.to_dict(), filters=self.filters,
                               top_k=self.top_k, filter_policy=self.filter_policy.value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        params = data.get("init_parameters", {})
        params["document_store"] = ShardragDocumentStore.from_dict(params["document_store"])
        return default_from_dict(cls, data)

    def _settings(self, filters: dict[str, Any] | None, top_k: int | None) -> tuple[dict[str, Any] | None, int]:
        return apply_filter_policy(self.filter_policy, self.filters, filters), self.top_k if top_k is None else top_k


@component
class ShardragEmbeddingRetriever(_Retriever):
    """The documents nearest a query embedding (a text embedder's output)."""

    @component.output_types(documents=list[Document])
    def run(self, query_embedding: list[float], filters: dict[str, Any] | None = None,
            top_k: int | None = None) -> dict[str, list[Document]]:
        filters, top_k = self._settings(filters, top_k)
        return {"documents": self.document_store.embedding_retrieval(query_embedding, filters=filters, top_k=top_k)}

    @component.output_types(documents=list[Document])
    async def run_async(self, query_embedding: list[float], filters: dict[str, Any] | None = None,
                        top_k: int | None = None) -> dict[str, list[Document]]:
        filters, top_k = self._settings(filters, top_k)
        return {"documents": await self.document_store.embedding_retrieval_async(query_embedding, filters=filters,
                                                                                 top_k=top_k)}


@component
class ShardragBM25Retriever(_Retriever):
    """The documents that best match a query's words (BM25, collection-wide statistics)."""

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict[str, Any] | None = None,
            top_k: int | None = None) -> dict[str, list[Document]]:
        filters, top_k = self._settings(filters, top_k)
        return {"documents": self.document_store.bm25_retrieval(query, filters=filters, top_k=top_k)}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, filters: dict[str, Any] | None = None,
                        top_k: int | None = None) -> dict[str, list[Document]]:
        filters, top_k = self._settings(filters, top_k)
        return {"documents": await self.document_store.bm25_retrieval_async(query, filters=filters, top_k=top_k)}


@component
class ShardragHybridRetriever(_Retriever):
    """BM25 and the embedding in one query, fused by ``fusion``: ``rrf`` (the default; ``rrf_k``,
    default 60 — a document without an embedding competes by its BM25 rank) or ``weighted``
    (``weights``, e.g. ``{"dense": 0.8, "lexical": 0.2}``, the gateway's default; docs/hybrid.md)."""

    def __init__(self, *, document_store: ShardragDocumentStore, filters: dict[str, Any] | None = None,
                 top_k: int = 10, filter_policy: str | FilterPolicy = FilterPolicy.REPLACE, fusion: str = "rrf",
                 weights: dict[str, float] | None = None, rrf_k: int | None = None) -> None:
        # the @component decorator makes a new class: a bare super() would name the old one
        _Retriever.__init__(self, document_store=document_store, filters=filters, top_k=top_k,
                            filter_policy=filter_policy)
        if fusion not in ("rrf", "weighted"):
            raise ValueError(f"fusion must be 'rrf' or 'weighted', got {fusion!r}")
        if (weights is not None and fusion != "weighted") or (rrf_k is not None and fusion != "rrf"):
            raise ValueError("weights go with fusion='weighted', rrf_k with fusion='rrf'")
        self.fusion, self.weights, self.rrf_k = fusion, weights, rrf_k

    def to_dict(self) -> dict[str, Any]:
        data = _Retriever.to_dict(self)
        data["init_parameters"].update(fusion=self.fusion, weights=self.weights, rrf_k=self.rrf_k)
        return data

    @component.output_types(documents=list[Document])
    def run(self, query: str, query_embedding: list[float], filters: dict[str, Any] | None = None,
            top_k: int | None = None) -> dict[str, list[Document]]:
        filters, top_k = self._settings(filters, top_k)
        return {"documents": self.document_store.hybrid_retrieval(query, query_embedding, filters=filters,
                                                                  top_k=top_k, fusion=self.fusion,
                                                                  weights=self.weights, rrf_k=self.rrf_k)}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, query_embedding: list[float], filters: dict[str, Any] | None = None,
                        top_k: int | None = None) -> dict[str, list[Document]]:
        filters, top_k = self._settings(filters, top_k)
        return {"documents": await self.document_store.hybrid_retrieval_async(
            query, query_embedding, filters=filters, top_k=top_k, fusion=self.fusion, weights=self.weights,
            rrf_k=self.rrf_k)}
