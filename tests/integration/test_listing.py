"""Listing a collection (``POST …/documents/scroll``) on a real cluster of 2 shards × 2 replicas:
pages in id order across the shards with the exact count, filters (date-time ranges, is_empty),
vectors exactly as written, the caller's writes and deletes seen at once, refusals naming the field."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from retrieval.client import ShardragClient
from retrieval.errors import InvalidRequest
from serving.local.launcher import LocalCluster
from tests.helpers.integrations import collections_cluster, dropped_after

pytestmark = pytest.mark.slow
DIM = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with collections_cluster(tmp_path_factory.mktemp("listing")) as running:
        yield running


def test_pages_in_id_order_with_counts_filters_and_vectors(cluster):
    with dropped_after(cluster, "list") as name, ShardragClient(cluster.gateway_url) as admin:
        admin.create_collection(name, dim=DIM, shards=2, replicas=2)
        client = admin.collection(name)
        vectors = np.random.default_rng(4).standard_normal((57, DIM)).astype(np.float32)
        documents = [{"id": f"d{i:03d}", "vector": vectors[i].tolist(), "text": f"passage {i}",
                      "metadata": {"n": i, **({"at": f"20{i % 20:02d}-06-01T08:00:00Z"} if i % 3 else {})}}
                     for i in range(57)]
        client.upsert(documents[:30])
        client.upsert(documents[30:])
        assert client.count() == 57
        seen, offset, pages = [], None, 0
        while True:
            page = client.scroll(limit=10, offset=offset, with_vectors=True)
            assert page["count"] == 57 and len(page["documents"]) <= 10
            seen.extend(page["documents"])
            pages += 1
            offset = page["next_offset"]
            if offset is None:
                break
        assert pages == 6 and [d["id"] for d in seen] == [f"d{i:03d}" for i in range(57)]
        assert {d["shard"] for d in seen} == {0, 1}  # both shards' documents, merged by id
        for i, document in enumerate(seen):
            assert np.asarray(document["vector"], dtype=np.float32).tobytes() == vectors[i].tobytes()
            assert (document["text"], document["metadata"]) == (documents[i]["text"], documents[i]["metadata"])
        recent = {"must": [{"key": "at", "range": {"gte": "2010-06-01T09:00:00+01:00"}}]}  # 08:00Z: included
        expected = [d["id"] for d in documents if "at" in d["metadata"] and d["metadata"]["at"] >= "2010"]
        assert [d["id"] for d in client.documents(filter=recent, page_size=4)] == expected
        undated = [d["id"] for d in client.documents(filter={"must": [{"is_empty": {"key": "at"}}]})]
        assert undated == [f"d{i:03d}" for i in range(0, 57, 3)] and client.count(filter=recent) == len(expected)
        # the caller's own writes and deletes, at once (each shard's primary answers)
        client.delete(["d000", "d010"])
        client.upsert([{"id": "d010", "vector": vectors[0].tolist(), "metadata": {"n": -1}}])
        listed = {d["id"]: d for d in client.documents()}
        assert "d000" not in listed and listed["d010"]["metadata"] == {"n": -1} and len(listed) == 56
        assert "vector" not in listed["d010"]
        for body, field in (({"filter": {"must": [{"key": "at", "range": {"gt": "yesterday"}}]}},
                             "filter.must[0].range.gt"), ({"limit": 5000}, "limit"), ({"offset": ""}, "offset")):
            with pytest.raises(InvalidRequest) as refused:
                client._check(client._post(f"/v1/collections/{name}/documents/scroll", body))
            assert refused.value.field == field, body


def test_documents_without_vectors_are_found_by_words_and_filters_never_by_vectors(cluster):
    with dropped_after(cluster, "bare") as name, ShardragClient(cluster.gateway_url) as admin:
        admin.create_collection(name, dim=DIM, shards=2, replicas=2)
        client = admin.collection(name)
        vectors = np.random.default_rng(5).standard_normal((8, DIM)).astype(np.float32)
        written = client.upsert([{"id": f"v{i}", "vector": vectors[i].tolist(), "text": f"orbit {i}"} for i in range(8)]
                                + [{"id": f"b{i}", "text": f"orbit of moon {i}", "no_vector": True,
                                    "metadata": {"moon": True}} for i in range(3)]
                                + [{"id": "meta-only", "no_vector": True, "metadata": {"moon": True}}])
        session = {"min_seq": written["seq"], "min_term": written["term"]}  # reads that hold the write
        for vector in vectors:
            hits = client.query(vector=vector.tolist(), k=12, **session)["hits"]
            assert len(hits) == 8 and all(h["doc_id"].startswith("v") for h in hits)
        moon = {"must": [{"key": "moon", "match": {"value": True}}]}
        moons = client.query(vector=vectors[0].tolist(), k=5, filter=moon, **session)["hits"]
        assert moons == []  # matches, but none has a vector to be scored
        lexical = client.query(text="moon", k=10, mode="lexical", **session)["hits"]
        assert sorted(h["doc_id"] for h in lexical) == ["b0", "b1", "b2"]
        listed = {d["id"]: d for d in client.documents(with_vectors=True)}
        assert len(listed) == 12 and "vector" not in listed["b1"] and "vector" in listed["v1"]
        assert listed["meta-only"]["text"] == "" and client.get("b2")["text"] == "orbit of moon 2"
        for body, field in (({"id": "x", "vector": vectors[0].tolist(), "no_vector": True}, "documents[0].no_vector"),
                            ({"id": "x", "text": "words"}, "documents.0.vector")):
            with pytest.raises(InvalidRequest) as refused:
                client.upsert([body])
            assert refused.value.field == field
        client.upsert([{"id": "b0", "vector": vectors[0].tolist()}])  # one of them gets a vector
        assert client.query(vector=vectors[0].tolist(), k=2, **session)["hits"][0]["doc_id"] in {"b0", "v0"}


def test_a_collection_dropped_and_made_again_at_once_starts_empty_and_keeps_its_writes(cluster):
    """Drop, then create under the same name before the nodes have reconciled: the new incarnation
    answers (empty), never the dropped one's replicas still loaded on the nodes — their reads would
    show the dropped documents and their writes would be lost with them."""
    import time

    with dropped_after(cluster, "again") as name, ShardragClient(cluster.gateway_url) as admin:
        vectors = np.random.default_rng(6).standard_normal((6, DIM)).astype(np.float32)
        for round_ in range(3):
            admin.create_collection(name, dim=DIM, shards=2, replicas=2)
            client = admin.collection(name)
            assert client.count() == 0, round_
            client.upsert([{"id": f"d{i}", "vector": vectors[i].tolist()} for i in range(3 + round_)])
            assert client.count() == 3 + round_
            if round_ < 2:
                admin.drop_collection(name)
        time.sleep(3)  # the nodes reconcile: what was written to this incarnation stays
        assert client.count() == 5 and len(list(client.documents())) == 5
