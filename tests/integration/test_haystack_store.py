"""Haystack's own conformance suite (``haystack.testing.document_store.DocumentStoreBaseExtendedTests``:
``DocumentStoreBaseTests`` and the delete-all, delete-by-filter and update-by-filter tests) against
``ShardragDocumentStore`` on a real local cluster (two node processes and a gateway), a fresh
collection for every test, dropped after it. The suite asks two things of every store:
``test_write_documents`` is the store's to write (its default policy is the store's choice), and
``assert_documents_are_equal`` is the hook for a store whose documents come back otherwise than the
list they were written in — here in id order, embeddings as float32."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from haystack.dataclasses import Document
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.testing.document_store import DocumentStoreBaseExtendedTests
from haystack.testing.document_store_async import (
    CountDocumentsAsyncTest,
    CountDocumentsByFilterAsyncTest,
    DeleteAllAsyncTest,
    DeleteByFilterAsyncTest,
    DeleteDocumentsAsyncTest,
    FilterDocumentsAsyncTest,
    UpdateByFilterAsyncTest,
    WriteDocumentsAsyncTest,
)

from integrations.haystack import ShardragDocumentStore
from serving.local.launcher import LocalCluster
from tests.helpers.integrations import collections_cluster, dropped_after

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with collections_cluster(tmp_path_factory.mktemp("haystack")) as running:
        yield running


def fresh_store(cluster: LocalCluster) -> Iterator[ShardragDocumentStore]:
    with dropped_after(cluster, "hs") as name:
        store = ShardragDocumentStore(url=cluster.gateway_url, collection=name, embedding_dim=768, shards=2)
        yield store
        store.close()


class SameDocuments:
    @staticmethod
    def assert_documents_are_equal(received: list[Document], expected: list[Document]) -> None:
        """The same documents, whatever the order (shardrag lists in id order); embeddings equal as
        float32, which the collection stores."""
        assert [d.id for d in received] == sorted(d.id for d in expected)
        by_id = {d.id: d for d in expected}
        for got in received:
            want = by_id[got.id]
            assert (got.content, got.meta, got.score, got.blob) == (want.content, want.meta, None, want.blob)
            if want.embedding is None:
                assert got.embedding is None
            else:
                assert np.asarray(got.embedding, dtype=np.float32).tobytes() == \
                    np.asarray(want.embedding, dtype=np.float32).tobytes()


class TestShardragDocumentStore(SameDocuments, DocumentStoreBaseExtendedTests):
    @pytest.fixture()
    def document_store(self, cluster) -> Iterator[ShardragDocumentStore]:  # type: ignore[override]
        yield from fresh_store(cluster)

    def test_write_documents(self, document_store: ShardragDocumentStore) -> None:
        """The default policy (NONE) is FAIL: an id written twice raises and changes nothing."""
        docs = [Document(id="1", content="first"), Document(id="2", content="second")]
        assert document_store.write_documents(docs) == 2
        with pytest.raises(DuplicateDocumentError):
            document_store.write_documents([Document(id="2", content="again"), Document(id="3", content="new")])
        self.assert_documents_are_equal(document_store.filter_documents(), docs)


class TestShardragDocumentStoreAsync(SameDocuments, CountDocumentsAsyncTest, CountDocumentsByFilterAsyncTest,
                                     DeleteAllAsyncTest, DeleteByFilterAsyncTest, DeleteDocumentsAsyncTest,
                                     FilterDocumentsAsyncTest, UpdateByFilterAsyncTest, WriteDocumentsAsyncTest):
    """The async suite's classes for what the store does (every ``*_async`` method of the base and
    extended protocol), as Haystack ships them."""

    @pytest.fixture()
    def document_store(self, cluster) -> Iterator[ShardragDocumentStore]:  # type: ignore[override]
        yield from fresh_store(cluster)

    async def test_write_documents_async(self, document_store: ShardragDocumentStore) -> None:
        """The default policy (NONE) is FAIL, as in the sync store."""
        docs = [Document(id="1", content="first"), Document(id="2", content="second")]
        assert await document_store.write_documents_async(docs) == 2
        with pytest.raises(DuplicateDocumentError):
            await document_store.write_documents_async([Document(id="2", content="again"),
                                                        Document(id="3", content="new")])
        self.assert_documents_are_equal(await document_store.filter_documents_async(), docs)


def test_retrievers_in_a_pipeline_read_their_writes_across_replicas(cluster):
    """Embedding, BM25 and hybrid retrievers in a Haystack Pipeline over 2 shards × 2 replicas:
    documents without an embedding come from BM25 only, filters hold, every read is a session
    read (any replica that answers holds the writes), and the components serialize."""
    from haystack import Pipeline

    from integrations.haystack import ShardragBM25Retriever, ShardragEmbeddingRetriever, ShardragHybridRetriever

    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((6, 8)).astype(np.float32)
    docs = [Document(id=f"e{i}", content=f"glacier {i} carves the valley", meta={"n": i, "ice": i % 2 == 0},
                     embedding=vectors[i].tolist()) for i in range(6)]
    docs += [Document(id="plain", content="glacier without an embedding", meta={"n": 9, "ice": True})]
    with dropped_after(cluster, "hsr") as name:
        store = ShardragDocumentStore(url=cluster.gateway_url, collection=name, embedding_dim=8, shards=2, replicas=2)
        assert store.write_documents(docs) == 7
        pipeline = Pipeline()
        pipeline.add_component("dense", ShardragEmbeddingRetriever(document_store=store, top_k=3))
        pipeline.add_component("bm25", ShardragBM25Retriever(document_store=store, top_k=10))
        out = pipeline.run({"dense": {"query_embedding": vectors[4].tolist()}, "bm25": {"query": "glacier"}})
        dense, lexical = out["dense"]["documents"], out["bm25"]["documents"]
        assert dense[0].id == "e4" and len(dense) == 3 and "plain" not in {d.id for d in dense}
        assert all(d.score is not None for d in dense) and dense[0].score >= dense[1].score
        assert {d.id for d in lexical} == {d.id for d in docs}  # the plain one too
        iced = ShardragEmbeddingRetriever(document_store=store, top_k=10,
                                          filters={"field": "meta.ice", "operator": "==", "value": True})
        assert {d.id for d in iced.run(query_embedding=vectors[1].tolist())["documents"]} == {"e0", "e2", "e4"}
        hybrid = ShardragHybridRetriever(document_store=store, top_k=7).run(
            query="without an embedding", query_embedding=vectors[3].tolist())["documents"]
        assert {"plain", "e3"} <= {d.id for d in hybrid[:2]}
        # an id list longer than one has_id holds, as a filter of a listing and of a query
        many = {"field": "id", "operator": "in", "value": [f"absent-{i}" for i in range(1_500)] + ["e5", "plain"]}
        assert [d.id for d in store.filter_documents(many)] == ["e5", "plain"]
        assert [d.id for d in ShardragBM25Retriever(document_store=store, filters=many).run(
            query="glacier")["documents"]] in (["e5", "plain"], ["plain", "e5"])
        # a weighted fusion on the component: the lexical leg alone ranks as BM25 does
        lexical_only = ShardragHybridRetriever(document_store=store, top_k=3, fusion="weighted",
                                               weights={"dense": 0.0, "lexical": 1.0})
        bm25_top = ShardragBM25Retriever(document_store=store, top_k=3).run(query="glacier")["documents"]
        assert [d.id for d in lexical_only.run(query="glacier", query_embedding=vectors[3].tolist())["documents"]] \
            == [d.id for d in bm25_top]
        kept = ShardragHybridRetriever.from_dict(lexical_only.to_dict())
        assert (kept.fusion, kept.weights, kept.rrf_k) == ("weighted", {"dense": 0.0, "lexical": 1.0}, None)
        with pytest.raises(ValueError, match="weights go with fusion='weighted'"):
            ShardragHybridRetriever(document_store=store, weights={"dense": 1.0})
        again = ShardragEmbeddingRetriever.from_dict(iced.to_dict())
        assert again.document_store.collection == name and again.filters == iced.filters
        # a delete is seen by the next read, on whichever replica answers
        store.delete_documents(["e4"])
        assert ShardragEmbeddingRetriever(document_store=store, top_k=1).run(
            query_embedding=vectors[4].tolist())["documents"][0].id != "e4"
        assert store.count_documents() == 6
        store.close()


async def test_retrievers_through_pipeline_run_async(cluster):
    """Pipeline.run_async (Haystack 3's async pipeline): the store's async writes, then both retrievers'
    run_async, with the session floors of those writes."""
    from haystack import Pipeline

    from integrations.haystack import ShardragBM25Retriever, ShardragEmbeddingRetriever

    vectors = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    docs = [Document(id=f"a{i}", content=f"fjord {i}", embedding=vectors[i].tolist()) for i in range(4)]
    with dropped_after(cluster, "hsa") as name:
        store = ShardragDocumentStore(url=cluster.gateway_url, collection=name, embedding_dim=8, shards=2, replicas=2)
        assert await store.write_documents_async(docs + [Document(id="plain", content="fjord alone")]) == 5
        pipeline = Pipeline()
        pipeline.add_component("dense", ShardragEmbeddingRetriever(document_store=store, top_k=2))
        pipeline.add_component("bm25", ShardragBM25Retriever(document_store=store, top_k=10))
        out = await pipeline.run_async({"dense": {"query_embedding": vectors[2].tolist()}, "bm25": {"query": "fjord"}})
        assert out["dense"]["documents"][0].id == "a2" and len(out["dense"]["documents"]) == 2
        assert {d.id for d in out["bm25"]["documents"]} == {"a0", "a1", "a2", "a3", "plain"}
        assert await store.count_documents_async() == 5
        store.close()


def test_a_store_creates_its_collection_in_its_lexical_language_and_serializes_it(cluster):
    from retrieval.client import ShardragClient

    with dropped_after(cluster, "hsl") as name:
        store = ShardragDocumentStore(url=cluster.gateway_url, collection=name, embedding_dim=8,
                                      lexical_language="german", retries=2)
        again = ShardragDocumentStore.from_dict(store.to_dict())
        assert (again.lexical_language, again.retries, again.link.target.client().retries) == ("german", 2, 2)
        assert store.write_documents([Document(id="see", content="Die Häuser am See")]) == 1  # made on first use
        with ShardragClient(cluster.gateway_url) as admin:
            assert admin.get_collection(name)["lexical_language"] == "german"
        store.close()
