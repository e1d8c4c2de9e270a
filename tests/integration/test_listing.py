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
