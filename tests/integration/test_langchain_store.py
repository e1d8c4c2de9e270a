"""LangChain's own conformance suite (``langchain-tests``' ``VectorStoreIntegrationTests``, unmodified)
against ``ShardragVectorStore`` on a real local cluster: one node process, a gateway, a fresh
collection of the suite's 6-dimensional fake embeddings for every test, dropped after it.
Then what the suite does not cover: filters, hybrid search, relevance scores, read-your-writes
across two replicas."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from langchain_core.documents import Document
from langchain_tests.integration_tests.vectorstores import VectorStoreIntegrationTests

from integrations.langchain import ShardragVectorStore
from retrieval.client import ShardragClient
from serving.local.launcher import LocalCluster
from tests.helpers.integrations import collections_cluster, dropped_after

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with collections_cluster(tmp_path_factory.mktemp("langchain")) as running:
        yield running


def fresh_store(cluster: LocalCluster, embedding, **kwargs) -> Iterator[ShardragVectorStore]:
    with dropped_after(cluster, "lc") as name:
        store = ShardragVectorStore.create(embedding, url=cluster.gateway_url, collection=name, **kwargs)
        yield store
        store.close()


class TestShardragVectorStoreStandard(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self, cluster) -> Iterator[ShardragVectorStore]:  # type: ignore[override]
        yield from fresh_store(cluster, self.get_embeddings())


@pytest.fixture()
def replicated(cluster) -> Iterator[ShardragVectorStore]:
    yield from fresh_store(cluster, VectorStoreIntegrationTests.get_embeddings(), shards=2, replicas=2)


def test_filters_hybrid_scores_and_reads_of_own_writes_across_replicas(replicated):
    store = replicated
    texts = ["glaciers carve fjords", "volcanoes build islands", "rivers cut canyons", "glaciers retreat"]
    ids = store.add_texts(texts, [{"kind": "ice"}, {"kind": "fire"}, {"kind": "water"}, {"kind": "ice"}])
    # every read below is a session read: both replicas of each shard must hold the writes to answer
    assert [d.page_content for d in store.similarity_search("rivers cut canyons", k=1)] == ["rivers cut canyons"]
    iced = store.similarity_search("rivers cut canyons", k=4, filter={"kind": "ice"})
    assert {d.id for d in iced} == {ids[0], ids[3]} and all(d.metadata == {"kind": "ice"} for d in iced)
    either = store.similarity_search("x", k=4, filter={"kind": ["ice", "fire"]})
    assert {d.id for d in either} == {ids[0], ids[1], ids[3]}
    native = store.similarity_search("x", k=4, filter={"must_not": [{"key": "kind", "match": {"value": "ice"}}]})
    assert {d.id for d in native} == {ids[1], ids[2]}
    # the operators of other LangChain stores (Chroma, PGVector, ...), through the gateway
    chosen = [({"kind": {"$ne": "ice"}}, {ids[1], ids[2]}),
              ({"kind": {"$in": ["fire", "water"]}}, {ids[1], ids[2]}),
              ({"$or": [{"kind": "fire"}, {"$and": [{"kind": {"$eq": "ice"}}, {"kind": {"$exists": True}}]}]},
               {ids[0], ids[1], ids[3]}),
              ({"$not": {"kind": {"$nin": ["water"]}}}, {ids[2]})]
    for given, wanted in chosen:
        assert {d.id for d in store.similarity_search("x", k=4, filter=given)} == wanted, given
    lexical = store.similarity_search("glaciers", k=4, mode="lexical")
    assert {d.id for d in lexical} == {ids[0], ids[3]}  # BM25: only passages holding the word
    hybrid = store.similarity_search_with_score("glaciers retreat", k=2, mode="hybrid", fusion="rrf")
    assert hybrid[0][0].page_content == "glaciers retreat"
    # the two best kinds, not the two best passages (both ice)
    kinds = [d.metadata["kind"] for d in store.similarity_search("glaciers retreat", k=2, group_by="kind")]
    assert len(kinds) == 2 and kinds[0] == "ice" and kinds[1] != "ice"
    assert [d.id for d in store.similarity_search("glaciers retreat", k=1, group_by="kind", group_size=2)] == \
        [ids[3], ids[0]]
    scored = store.similarity_search_with_relevance_scores("volcanoes build islands", k=4)
    assert scored[0][0].id == ids[1] and scored[0][1] == pytest.approx(1.0, abs=1e-5)
    assert all(0.0 <= score <= 1.0 for _, score in scored)
    many = [f"absent-{i}" for i in range(1_500)] + [ids[2], ids[0], ids[2]]  # past what one has_id holds
    assert [d.id for d in store.get_by_ids(many)] == [ids[2], ids[0]]
    assert [d.id for d in asyncio.run(store.aget_by_ids(many))] == [ids[2], ids[0]]
    store.delete(filter={"kind": "ice"})
    assert {d.id for d in store.similarity_search("glaciers", k=4)} == {ids[1], ids[2]}
    with pytest.raises(ValueError, match="zero vector"):
        store.similarity_search_by_vector([0.0] * 6)
    retriever = store.as_retriever(search_kwargs={"k": 1, "filter": {"kind": "water"}})
    assert retriever.invoke("anything") == [Document(id=ids[2], page_content="rivers cut canyons",
                                                     metadata={"kind": "water"})]


def test_max_marginal_relevance_gives_a_near_duplicate_way_to_a_different_passage(replicated):
    store = replicated
    texts = ["glaciers carve fjords", "glaciers carve fjords", "volcanoes build islands", "rivers cut canyons"]
    ids = store.add_texts(texts, [{"kind": "ice"}, {"kind": "ice"}, {"kind": "fire"}, {"kind": "water"}])
    assert {d.id for d in store.similarity_search("glaciers carve fjords", k=2)} == {ids[0], ids[1]}
    # lambda 0.25: the second copy scores 0.25 - 0.75 against any other passage's 0.25 s - 0.75 s
    for found in (store.max_marginal_relevance_search("glaciers carve fjords", k=2, fetch_k=4, lambda_mult=0.25),
                  asyncio.run(store.amax_marginal_relevance_search("glaciers carve fjords", k=2, fetch_k=4,
                                                                   lambda_mult=0.25))):
        assert found[0].id in ids[:2] and found[1].id in ids[2:] and found[0].page_content == texts[0]
    retriever = store.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 4, "lambda_mult": 0.25,
                                                                     "filter": {"kind": {"$ne": "fire"}}})
    assert [d.id for d in retriever.invoke("glaciers carve fjords")][1] == ids[3]  # fire is filtered out
    with pytest.raises(ValueError, match="re-ranks the dense leg"):
        store.max_marginal_relevance_search("glaciers", k=2, mode="hybrid")


def test_a_store_refuses_a_collection_of_another_dimension(cluster):
    name = f"lc-{uuid.uuid4().hex[:12]}"
    with ShardragClient(cluster.gateway_url) as admin:
        admin.create_collection(name, dim=5)
        try:
            with pytest.raises(ValueError, match="dim 5"):
                ShardragVectorStore.create(VectorStoreIntegrationTests.get_embeddings(), url=cluster.gateway_url,
                                           collection=name)
        finally:
            admin.drop_collection(name)


def test_a_store_creates_its_collection_in_its_lexical_language(cluster):
    for store in fresh_store(cluster, VectorStoreIntegrationTests.get_embeddings(), lexical_language="german",
                             retries=2):
        assert store.client.retries == 2
        ids = store.add_texts(["Die Häuser am See", "Ein kleiner Garten"])
        assert [d.id for d in store.similarity_search("Haus", k=2, mode="lexical")] == [ids[0]]  # German stems
        with ShardragClient(cluster.gateway_url) as admin:
            assert admin.get_collection(store.target.collection)["lexical_language"] == "german"
