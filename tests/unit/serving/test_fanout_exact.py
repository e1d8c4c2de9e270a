"""Sharded top-10 equals one unsharded exact IndexFlatIP: N ∈ {1,2,3,4}, hash and kmeans,
real MiniLM embeddings of every msmarco query (in-process shards; real processes in
tests/integration)."""

import numpy as np
import pytest

from retrieval.ir_metrics import overlap_at_k
from tests.conftest import REPORT
from tests.helpers.oracle import ExactOracle, assert_same_ranking
from tests.unit.serving.gateway_harness import build, gateway_client


@pytest.fixture(scope="module")
def oracle(msmarco):
    return ExactOracle([d.doc_id for d in msmarco.documents], msmarco.vectors)


def ask(client, vector, **extra):
    response = client.post("/v1/query", json={"vector": vector.tolist(), "k": 10, **extra})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("partitioner", ["hash", "kmeans"])
@pytest.mark.parametrize("num_shards", [1, 2, 3, 4])
def test_sharded_top10_equals_unsharded_exact(tmp_path, msmarco, oracle, num_shards, partitioner):
    shards = build(tmp_path, "msmarco", msmarco.documents, msmarco.vectors, msmarco.version, num_shards, partitioner)
    assert sum(s.manifest.count for s in shards) == len(msmarco.documents)
    with gateway_client(shards) as client:
        for query_vector in msmarco.query_vectors:
            body = ask(client, query_vector)
            got = [(h["doc_id"], h["score"]) for h in body["hits"]]
            assert_same_ranking(got, oracle.top_k(query_vector, 10))
            assert body["diagnostics"]["shards_answered"] == num_shards
            assert body["version"] == msmarco.version.id


def test_kmeans_routing(tmp_path, msmarco, oracle):
    num_shards = 4
    shards = build(tmp_path, "msmarco", msmarco.documents, msmarco.vectors, msmarco.version, num_shards, "kmeans")
    with gateway_client(shards) as client:
        for query_vector in msmarco.query_vectors:  # top_m = N is exactly full fan-out
            full = ask(client, query_vector)
            routed = ask(client, query_vector, top_m=num_shards)
            assert [h["doc_id"] for h in routed["hits"]] == [h["doc_id"] for h in full["hits"]]
            assert [h["score"] for h in routed["hits"]] == [h["score"] for h in full["hits"]]
        for top_m in range(1, num_shards):
            recalls = []
            for query_vector in msmarco.query_vectors:
                body = ask(client, query_vector, top_m=top_m)
                assert body["diagnostics"]["shards_queried"] == top_m
                exact = [doc for doc, _ in oracle.top_k(query_vector, 10)]
                recalls.append(overlap_at_k([h["doc_id"] for h in body["hits"]], exact, 10))
            recall = float(np.mean(recalls))
            REPORT.append(f"kmeans routing, msmarco, {num_shards} shards, top_m={top_m}: "
                          f"recall@10 vs exact = {recall:.3f} ({top_m / num_shards:.0%} of shards queried)")
            assert 0.0 < recall <= 1.0
