"""LlamaIndex end to end through a real local cluster: a ``VectorStoreIndex`` over
``integrations.llamaindex.ShardragVectorStore`` built from real MS MARCO passages with the real
MiniLM model (LlamaIndex splits, embeds and writes; shardrag stores and searches), then queried —
dense, hybrid and BM25, with metadata filters — and its documents deleted through the index."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from integrations.llamaindex import ShardragVectorStore
from retrieval.datasets import load_beir
from serving.local.launcher import LocalCluster
from tests.conftest import data_dir
from tests.helpers.integrations import collections_cluster, dropped_after

pytestmark = pytest.mark.slow
PASSAGES = 60


class MiniLMEmbedding(BaseEmbedding):
    """The project's MiniLM (cached embeddings) as a LlamaIndex embedding model."""

    _encoder: Any = PrivateAttr()

    def __init__(self, encoder: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2", embed_batch_size=64)
        self._encoder = encoder

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encoder.encode_queries([query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encoder.encode_texts(texts).tolist()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with collections_cluster(tmp_path_factory.mktemp("llamaindex")) as running:
        yield running


@pytest.fixture()
def store(cluster) -> Iterator[ShardragVectorStore]:
    with dropped_after(cluster, "li") as name:
        made = ShardragVectorStore.create(url=cluster.gateway_url, collection=name, dim=384, shards=2, replicas=2)
        yield made
        made.close()


def passages() -> list[Document]:
    corpus = load_beir(data_dir() / "msmarco").corpus[:PASSAGES]
    return [Document(text=d.text, doc_id=f"msmarco-{d.doc_id}",
                     metadata={"source": "msmarco", "rank": i, "half": "first" if i < PASSAGES // 2 else "second"})
            for i, d in enumerate(corpus)]


def test_a_vector_store_index_answers_through_the_cluster(store, encoder):
    documents = passages()
    embed = MiniLMEmbedding(encoder)
    index = VectorStoreIndex.from_documents(documents, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=embed, transformations=[SentenceSplitter(chunk_size=256,
                                                                                                 chunk_overlap=32)])
    target = documents[17]
    question = target.text[:120]

    # the query engine: retrieval through shardrag, a (mock) LLM on top; its sources are shardrag's hits
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=3)
    sources = engine.query(question).source_nodes
    assert sources[0].node.ref_doc_id == target.doc_id and sources[0].node.metadata["rank"] == 17
    assert sources[0].node.get_content() in target.text and sources[0].score > 0.5

    # hybrid (weighted: alpha on the vectors) and BM25 alone find it too
    hybrid = index.as_retriever(similarity_top_k=3, vector_store_query_mode="hybrid", alpha=0.6).retrieve(question)
    assert hybrid[0].node.ref_doc_id == target.doc_id
    lexical = index.as_retriever(similarity_top_k=3, vector_store_query_mode="text_search").retrieve(question)
    assert lexical[0].node.ref_doc_id == target.doc_id

    # metadata filters: LlamaIndex's operators, in shardrag's language
    second_half = MetadataFilters(filters=[MetadataFilter(key="half", value="second")])
    assert all(n.node.metadata["half"] == "second"
               for n in index.as_retriever(similarity_top_k=5, filters=second_half).retrieve(question))
    ranks = MetadataFilters(filters=[MetadataFilter(key="rank", value=10, operator=FilterOperator.GTE),
                                     MetadataFilter(key="rank", value=20, operator=FilterOperator.LT),
                                     MetadataFilter(key="rank", value=[17], operator=FilterOperator.NIN)],
                            condition=FilterCondition.AND)
    found = {n.node.metadata["rank"] for n in index.as_retriever(similarity_top_k=20, filters=ranks).retrieve(question)}
    assert found and found <= set(range(10, 20)) - {17}
    either = MetadataFilters(filters=[MetadataFilter(key="rank", value=3), MetadataFilter(key="rank", value=4)],
                             condition=FilterCondition.OR)
    assert {n.node.metadata["rank"] for n in index.as_retriever(similarity_top_k=10,
                                                                filters=either).retrieve(question)} == {3, 4}
    unset = MetadataFilters(filters=[MetadataFilter(key="reviewed", value=None, operator=FilterOperator.IS_EMPTY),
                                     MetadataFilter(key="rank", value=None, operator=FilterOperator.IS_EMPTY)],
                            condition=FilterCondition.OR)  # no node has "reviewed"; every one has a rank
    assert len(index.as_retriever(similarity_top_k=5, filters=unset).retrieve(question)) == 5
    with pytest.raises(NotImplementedError, match="text_match"):
        index.as_retriever(filters=MetadataFilters(filters=[MetadataFilter(
            key="source", value="ms", operator=FilterOperator.TEXT_MATCH)])).retrieve(question)

    # deleting a document through the index removes every node of it, and only those
    index.delete_ref_doc(target.doc_id)
    after = index.as_retriever(similarity_top_k=5).retrieve(question)
    assert target.doc_id not in {n.node.ref_doc_id for n in after} and len(after) == 5


def test_node_reads_deletes_and_async_queries(store, encoder):
    embed = MiniLMEmbedding(encoder)
    nodes = SentenceSplitter(chunk_size=256, chunk_overlap=32).get_nodes_from_documents(passages()[:10])
    for node in nodes:
        node.embedding = embed.get_text_embedding(node.get_content())
    ids = store.add(nodes)
    assert [n.node_id for n in store.get_nodes(node_ids=[ids[0], "absent"])] == [ids[0]]
    # reads by filter, by ids and filter, and of everything; ids past what one has_id holds
    fourth = MetadataFilters(filters=[MetadataFilter(key="rank", value=4)])
    by_rank = [n.node_id for n in store.get_nodes(filters=fourth)]
    assert by_rank == sorted(i for i, n in zip(ids, nodes) if n.metadata["rank"] == 4) and by_rank
    assert [n.node_id for n in asyncio.run(store.aget_nodes(filters=fourth))] == by_rank
    assert [n.node_id for n in store.get_nodes(node_ids=[ids[0], *reversed(by_rank)], filters=fourth)] == \
        list(reversed(by_rank))
    assert sorted(n.node_id for n in store.get_nodes()) == sorted(ids)
    many = [f"absent-{i}" for i in range(1_500)] + [ids[2], ids[0], ids[2]]
    assert [n.node_id for n in store.get_nodes(node_ids=many)] == [ids[2], ids[0]]
    assert [n.node_id for n in asyncio.run(store.aget_nodes(node_ids=many))] == [ids[2], ids[0]]
    # mmr: at threshold 1 relevance alone (the dense order), below it no node twice and the best first
    dense_top = store.query(VectorStoreQuery(query_embedding=nodes[3].embedding, similarity_top_k=3)).ids
    relevance = VectorStoreQuery(query_embedding=nodes[3].embedding, similarity_top_k=3,
                                 mode=VectorStoreQueryMode.MMR, mmr_threshold=1.0)
    assert store.query(relevance).ids == dense_top
    diverse = VectorStoreQuery(query_embedding=nodes[3].embedding, similarity_top_k=3,
                               mode=VectorStoreQueryMode.MMR, mmr_threshold=0.3)
    found = store.query(diverse, mmr_prefetch_k=8)
    assert found.ids[0] == dense_top[0] and len(set(found.ids)) == 3 and [n.node_id for n in found.nodes] == found.ids
    assert asyncio.run(store.aquery(diverse, mmr_prefetch_k=8)).ids == found.ids
    restricted = VectorStoreQuery(query_embedding=nodes[3].embedding, similarity_top_k=5, node_ids=many)
    assert sorted(store.query(restricted).ids) == sorted([ids[0], ids[2]])
    query = VectorStoreQuery(query_embedding=nodes[3].embedding, similarity_top_k=2)
    assert store.query(query).ids[0] == ids[3]
    assert asyncio.run(store.aquery(query)).ids[0] == ids[3]
    store.delete_nodes(node_ids=[ids[3]])
    assert ids[3] not in store.query(query).ids
    asyncio.run(store.adelete_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="rank", value=4)])))
    assert all(n.metadata["rank"] != 4 for n in store.query(VectorStoreQuery(
        query_embedding=nodes[3].embedding, similarity_top_k=10)).nodes)
    # a delete by ids and filter, the ids past what one has_id holds: only the nodes both select
    rank_of_2 = MetadataFilters(filters=[MetadataFilter(key="rank", value=nodes[2].metadata["rank"])])
    before = {n.node_id for n in store.get_nodes(filters=rank_of_2)}
    assert ids[2] in before and ids[0] not in before  # passages 2 and 0
    store.delete_nodes(node_ids=many, filters=rank_of_2)
    assert [n.node_id for n in store.get_nodes(node_ids=many)] == [ids[0]]
    assert {n.node_id for n in store.get_nodes(filters=rank_of_2)} == before - {ids[2]}
    store.clear()
    assert store.query(query).ids == []
    with pytest.raises(ValueError, match="without an embedding"):
        store.add([nodes[0].model_copy(update={"embedding": None})])


def test_a_store_creates_its_collection_in_its_lexical_language(cluster):
    from retrieval.client import ShardragClient

    with dropped_after(cluster, "li") as name:
        made = ShardragVectorStore.create(url=cluster.gateway_url, collection=name, dim=8, lexical_language="french",
                                          retries=2)
        with ShardragClient(cluster.gateway_url) as admin:
            assert admin.get_collection(name)["lexical_language"] == "french"
        assert made.client.retries == 2 and made.get_nodes() == []
        made.close()
