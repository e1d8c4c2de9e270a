"""``ShardragVectorStore``: a LlamaIndex vector store over one shardrag collection.

    from llama_index.core import StorageContext, VectorStoreIndex
    from integrations.llamaindex import ShardragVectorStore

    store = ShardragVectorStore.create(url="http://127.0.0.1:8000", collection="docs", dim=384)
    index = VectorStoreIndex.from_documents(documents, storage_context=StorageContext.from_defaults(
        vector_store=store), embed_model=embed_model)
    index.as_retriever(similarity_top_k=4).retrieve("how are fjords formed")
    index.as_retriever(vector_store_query_mode="hybrid", alpha=0.6).retrieve("fjords")   # BM25 + vectors

Each node is written with LlamaIndex's embedding, its text and its metadata, plus ``ref_doc_id``
(the document it came from: ``delete(ref_doc_id)`` removes its nodes). A node read back is a
``TextNode`` with its id, text, metadata and its source relationship; other node fields (start and
end offsets, excluded-metadata lists, other relationships) are not kept. Metadata must be flat
(strings, numbers, booleans, lists of strings); ``None`` values are dropped.

Query modes: ``default`` (dense), ``hybrid`` (``alpha`` given: weighted fusion, alpha on the
vectors, 1 − alpha on BM25; else RRF), ``text_search`` / ``sparse`` (BM25 alone), ``mmr`` (the
dense hits re-ranked for diversity by LlamaIndex's own MMR). Reads after this
store's writes are session reads (they see those writes on every replica).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings
from llama_index.core.schema import BaseNode, NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)

from integrations.common import DISTANCES, CollectionLink, StoreTarget, ensure_collection, prepared_vectors
from integrations.lists import any_condition, aread_by_ids, id_chunks, ids_condition, read_by_ids
from integrations.llamaindex.filters import to_shardrag
from retrieval.client import ShardragClient
from retrieval.session import SessionFloors

MAX_BATCH = 1000  # documents per write request (the gateway's limit)
REF_DOC_KEY = "ref_doc_id"
# selects every document: none can have an id longer than the write API's 512 characters
EVERYTHING = {"must_not": [{"has_id": ["*" * 513]}]}
_MODES = {VectorStoreQueryMode.DEFAULT: "dense", VectorStoreQueryMode.HYBRID: "hybrid",
          VectorStoreQueryMode.TEXT_SEARCH: "lexical", VectorStoreQueryMode.SPARSE: "lexical"}


class ShardragVectorStore(BasePydanticVectorStore):
    stores_text: bool = True
    flat_metadata: bool = True
    url: str
    collection: str
    distance: str = "cosine"
    api_key: str | None = None
    timeout_s: float = 30.0
    write_ack: str = "majority"
    retries: int = 0  # how many more times a request is sent where that is safe (the client's)

    _link: CollectionLink = PrivateAttr()

    @classmethod
    def create(cls, *, url: str, collection: str, dim: int, distance: str = "cosine", shards: int = 1,
               replicas: int = 1, factory: str = "Flat", lexical_language: str | None = None,
               **kwargs: Any) -> ShardragVectorStore:
        """The store over ``collection``, created with ``dim`` dimensions (its texts analysed for
        lexical search in ``lexical_language``, default english) when it does not exist (an
        existing one of another dimension or metric is refused)."""
        with ShardragClient(url, api_key=kwargs.get("api_key"), timeout_s=kwargs.get("timeout_s", 30.0),
                            retries=kwargs.get("retries", 0)) as admin:
            ensure_collection(admin, collection, dim=dim, distance=distance, shards=shards, replicas=replicas,
                              factory=factory, lexical_language=lexical_language)
        return cls(url=url, collection=collection, distance=distance, **kwargs)

    def model_post_init(self, context: Any, /) -> None:
        if self.distance not in DISTANCES:
            raise ValueError(f"distance must be one of {sorted(DISTANCES)}, got {self.distance!r}")
        self._link = CollectionLink(StoreTarget(self.url, self.collection, self.api_key, self.timeout_s, self.retries))

    @classmethod
    def class_name(cls) -> str:
        return "ShardragVectorStore"

    @property
    def target(self) -> StoreTarget:
        return self._link.target

    @property
    def client(self) -> ShardragClient:
        return self._link.client

    @property
    def _floors(self) -> SessionFloors:
        return self._link.floors

    def close(self) -> None:
        self._link.close()

    # -- writes ----------------------------------------------------------------------------------
    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        for batch in self._batches(nodes):
            self._floors.note(self.client.upsert(batch, write_ack=self.write_ack))
        return [node.node_id for node in nodes]

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        async with self.target.async_client() as client:
            for batch in self._batches(nodes):
                self._floors.note(await client.upsert(batch, write_ack=self.write_ack))
        return [node.node_id for node in nodes]

    def _batches(self, nodes: Sequence[BaseNode]) -> list[list[dict[str, Any]]]:
        missing = [node.node_id for node in nodes if node.embedding is None]
        if missing:
            raise ValueError(f"nodes without an embedding (embed them first): {missing[:5]}")
        vectors = prepared_vectors([node.get_embedding() for node in nodes], self.distance)
        documents = [_document(node, vector) for node, vector in zip(nodes, vectors, strict=True)]
        return [documents[i:i + MAX_BATCH] for i in range(0, len(documents), MAX_BATCH)]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Every node of the document ``ref_doc_id``."""
        self._floors.note(self.client.delete(filter=_of_document(ref_doc_id), write_ack=self.write_ack))

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        async with self.target.async_client() as client:
            self._floors.note(await client.delete(filter=_of_document(ref_doc_id), write_ack=self.write_ack))

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        for body in _deletions(node_ids, filters):
            self._floors.note(self.client.delete(write_ack=self.write_ack, **body))

    async def adelete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                            **delete_kwargs: Any) -> None:
        async with self.target.async_client() as client:
            for body in _deletions(node_ids, filters):
                self._floors.note(await client.delete(write_ack=self.write_ack, **body))

    def clear(self) -> None:
        """Delete every node (in rounds: one delete-by-filter removes at most 100,000)."""
        while self.client.delete(filter=EVERYTHING, write_ack=self.write_ack)["ids"]:
            pass

    async def aclear(self) -> None:
        async with self.target.async_client() as client:
            while (await client.delete(filter=EVERYTHING, write_ack=self.write_ack))["ids"]:
                pass

    # -- reads -----------------------------------------------------------------------------------
    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The nodes of ``node_ids`` that exist (in that order), of them those ``filters`` selects;
        with ``filters`` alone every node it selects, and with neither every node (in id order:
        a listing, a thousand a request)."""
        if node_ids is None:
            return [_node(found) for found in self.client.documents(filter=_selection(filters), page_size=1000)]
        return [_node(found) for found in read_by_ids(self.client, node_ids, _selection(filters))]

    async def aget_nodes(self, node_ids: list[str] | None = None,
                         filters: MetadataFilters | None = None) -> list[BaseNode]:
        async with self.target.async_client() as client:
            if node_ids is None:
                return [_node(found) async for found in client.documents(filter=_selection(filters), page_size=1000)]
            return [_node(found) for found in await aread_by_ids(client, node_ids, _selection(filters))]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """``mmr``: the dense leg's ``mmr_prefetch_k`` hits (default ``mmr_prefetch_factor`` — 4 —
        × ``similarity_top_k``), their vectors read back by id, re-ranked by LlamaIndex's own
        ``get_top_k_mmr_embeddings`` under ``mmr_threshold`` (the query's, or a keyword's)."""
        if query.mode != VectorStoreQueryMode.MMR:
            return _result(self.client.query(**self._arguments(query)))
        reply = self.client.query(**self._arguments(_candidates(query, kwargs)))
        found = read_by_ids(self.client, [hit["doc_id"] for hit in reply["hits"]], with_vectors=True)
        return _diverse(query, reply, found, kwargs)

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        async with self.target.async_client() as client:
            if query.mode != VectorStoreQueryMode.MMR:
                return _result(await client.query(**self._arguments(query)))
            reply = await client.query(**self._arguments(_candidates(query, kwargs)))
            found = await aread_by_ids(client, [hit["doc_id"] for hit in reply["hits"]], with_vectors=True)
        return _diverse(query, reply, found, kwargs)

    def _arguments(self, query: VectorStoreQuery) -> dict[str, Any]:
        if query.mode not in _MODES:
            raise NotImplementedError(f"query mode {query.mode.value!r}: shardrag serves "
                                      f"{sorted([*(m.value for m in _MODES), VectorStoreQueryMode.MMR.value])}")
        mode = _MODES[query.mode]
        args: dict[str, Any] = {"k": query.hybrid_top_k or query.similarity_top_k, "mode": mode,
                                "with_metadata": True, **self._floors.query_args()}
        if mode != "lexical":
            if query.query_embedding is None:
                raise ValueError(f"a {mode} query needs query_embedding")
            args["vector"] = prepared_vectors([query.query_embedding], self.distance)[0]
        if mode != "dense":
            if not query.query_str:
                raise ValueError(f"a {mode} query needs query_str")
            args["text"] = query.query_str
        if mode == "hybrid":
            if query.alpha is not None:
                args.update(fusion="weighted", weights={"dense": query.alpha, "lexical": 1.0 - query.alpha})
            args["candidates"] = max(query.sparse_top_k or 0, query.similarity_top_k, args["k"])
        clauses = [to_shardrag(query.filters)] if query.filters is not None else []
        if query.node_ids:
            clauses.append(ids_condition(query.node_ids))
        if query.doc_ids:
            clauses.append(any_condition(REF_DOC_KEY, query.doc_ids))
        if clauses:
            args["filter"] = clauses[0] if len(clauses) == 1 and query.filters is not None else {"must": clauses}
        return args


def _document(node: BaseNode, vector: list[float]) -> dict[str, Any]:
    metadata = {key: value for key, value in node.metadata.items() if value is not None}
    if node.ref_doc_id is not None:
        metadata[REF_DOC_KEY] = node.ref_doc_id
    document: dict[str, Any] = {"id": node.node_id, "vector": vector, "metadata": metadata}
    text = node.get_content()
    if text.strip():  # blank text is not stored (the API refuses it); the node reads back with ""
        document["text"] = text
    return document


def _node(found: dict[str, Any]) -> TextNode:
    metadata = dict(found.get("metadata") or {})
    ref_doc_id = metadata.pop(REF_DOC_KEY, None)
    relationships = {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=ref_doc_id)} if ref_doc_id else {}
    return TextNode(id_=found.get("id") or found["doc_id"], text=found.get("text") or "", metadata=metadata,
                    relationships=relationships)


def _result(reply: dict[str, Any]) -> VectorStoreQueryResult:
    hits = reply["hits"]
    return VectorStoreQueryResult(nodes=[_node(hit) for hit in hits], similarities=[float(h["score"]) for h in hits],
                                  ids=[hit["doc_id"] for hit in hits])


def _candidates(query: VectorStoreQuery, options: dict[str, Any]) -> VectorStoreQuery:
    """An MMR query's dense search for its candidates."""
    prefetch = options.get("mmr_prefetch_k") or int(query.similarity_top_k * options.get("mmr_prefetch_factor", 4.0))
    if prefetch < query.similarity_top_k or query.similarity_top_k < 1:
        raise ValueError(f"mmr: prefetch {prefetch} hits for similarity_top_k {query.similarity_top_k}; it must be at "
                         "least that, and that at least 1")
    return dataclasses.replace(query, mode=VectorStoreQueryMode.DEFAULT, similarity_top_k=prefetch)


def _diverse(query: VectorStoreQuery, reply: dict[str, Any], found: list[dict[str, Any]],
             options: dict[str, Any]) -> VectorStoreQueryResult:
    """The MMR of the hits whose vectors were read back (a node deleted in between is left out)."""
    vectors = {document["id"]: document["vector"] for document in found if document.get("vector") is not None}
    hits = {hit["doc_id"]: hit for hit in reply["hits"] if hit["doc_id"] in vectors}
    if not hits or query.query_embedding is None:
        return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
    ids = list(hits)
    scores, chosen = get_top_k_mmr_embeddings(list(query.query_embedding), [vectors[i] for i in ids],
                                              similarity_top_k=query.similarity_top_k, embedding_ids=ids,
                                              mmr_threshold=options.get("mmr_threshold", query.mmr_threshold))
    return VectorStoreQueryResult(nodes=[_node(hits[i]) for i in chosen], similarities=list(scores), ids=list(chosen))


def _of_document(ref_doc_id: str) -> dict[str, Any]:
    return {"must": [{"key": REF_DOC_KEY, "match": {"value": ref_doc_id}}]}


def _selection(filters: MetadataFilters | None) -> dict[str, Any] | None:
    return to_shardrag(filters) if filters is not None else None


def _deletions(node_ids: list[str] | None, filters: MetadataFilters | None) -> list[dict[str, Any]]:
    if node_ids is None:
        if filters is None:
            raise ValueError("delete_nodes needs node_ids, filters or both")
        return [{"filter": to_shardrag(filters)}]
    unique = list(dict.fromkeys(node_ids))
    if filters is None:
        return [{"ids": unique[i:i + MAX_BATCH]} for i in range(0, len(unique), MAX_BATCH)]
    # the nodes of node_ids that filters selects: a delete by filter per chunk of ids a has_id holds
    selected = to_shardrag(filters)
    return [{"filter": {"must": [selected, {"has_id": chunk}]}} for chunk in id_chunks(unique)]
