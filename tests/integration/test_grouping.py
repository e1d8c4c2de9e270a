"""group_by through real processes: 3 Flat shards of the 5k dbpedia documents with synthetic
metadata, against an oracle that groups the exact ranking of every document. Dense groups equal
the oracle's (values, order, scores) for a scalar key, a list key and values that compare as
filters compare them; a lexical query's groups are those of its own deeper ranked list; the
rounds stop when the groups are full or at the read cap, and say which; refusals name the field."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.filters import tagged
from retrieval.types import Document
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

pytestmark = pytest.mark.slow
KINDS = (1, 1.0, True, "1")  # three values: 1 and 1.0 are one, as a filter's match reads them


@pytest.fixture(scope="module")
def cluster(dbpedia, tmp_path_factory):
    rng = np.random.default_rng(5)
    documents = [Document(d.doc_id, d.text, d.title, {
        "bucket": int(rng.integers(0, 30)), "tags": [f"t{int(t)}" for t in rng.choice(6, 2, replace=False)],
        "kind": KINDS[i % 4],
    }) for i, d in enumerate(dbpedia.documents)]
    root, work = tmp_path_factory.mktemp("root"), tmp_path_factory.mktemp("work")
    build_collection(root, documents, dbpedia.vectors, dbpedia.version, BuildConfig("grouped", 3, factory="Flat"),
                     show_progress=False)
    config = GatewayConfig.from_dict({"encoder": {"load": False}})
    with LocalCluster(root, "grouped", replicas=1, gateway=config, workdir=work) as running, \
            httpx.Client(base_url=running.gateway_url, timeout=60) as http:
        yield http, documents, dbpedia, running.gateway_url


def oracle(documents, vectors, query, key, k, size):
    """(group, score) per hit of the k best groups of the exact ranking."""
    scores = vectors @ query
    groups: dict = {}
    for j in np.argsort(-scores, kind="stable"):
        value = documents[j].metadata[key]
        for item in value if isinstance(value, list) else [value]:
            members = groups.get(tagged(item))
            if members is None and len(groups) < k:
                members = groups[tagged(item)] = []
            if members is not None and len(members) < size:
                members.append((tagged(item), float(scores[j])))
    return [hit for members in groups.values() for hit in members]


def grouped(http, body):
    response = http.post("/v1/query", json={"with_text": False, **body})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("key, k, size", [("bucket", 5, 2), ("tags", 3, 3), ("kind", 5, 4)])
def test_dense_groups_are_the_exact_rankings(cluster, key, k, size):
    http, documents, corpus, _ = cluster
    for query in corpus.query_vectors[:12]:
        answer = grouped(http, {"vector": query.tolist(), "k": k, "group_by": key, "group_size": size})
        want = oracle(documents, corpus.vectors, query, key, k, size)
        got = answer["hits"]
        assert [tagged(h["group"]) for h in got] == [group for group, _ in want]
        assert np.allclose([h["score"] for h in got], [score for _, score in want], atol=1e-5)
        assert all("metadata" not in h for h in got)  # read for grouping, answered only when asked
        groups = answer["diagnostics"]["groups"]
        assert groups["by"] == key and groups["size"] == size
        if key == "kind":  # three values for five groups: read as deep as a grouped query reads, in vain
            assert (groups["groups"], groups["read"], groups["rounds"], groups["filled"]) == (3, 1000, 5, False)
        else:
            assert groups["groups"] == k and groups["filled"]


def test_lexical_groups_are_those_of_the_deeper_list_and_keep_the_metadata_asked(cluster):
    http, _, corpus, _ = cluster
    for text in list(corpus.dataset.queries.values())[:8]:
        ranked = grouped(http, {"text": text, "mode": "lexical", "k": 100, "with_metadata": True})["hits"]
        answer = grouped(http, {"text": text, "mode": "lexical", "k": 4, "group_by": "bucket",
                                "with_metadata": True})
        seen: dict = {}
        for hit in ranked:
            if len(seen) < 4:
                seen.setdefault(hit["metadata"]["bucket"], hit["doc_id"])
        assert [(h["group"], h["doc_id"]) for h in answer["hits"]] == list(seen.items())
        assert all(h["metadata"]["bucket"] == h["group"] for h in answer["hits"])


def test_rounds_stop_where_the_list_runs_out_or_at_the_cap(cluster):
    http, documents, corpus, _ = cluster
    query = corpus.query_vectors[0].tolist()
    # ~170 documents in bucket 3: the first round deeper than that reads them all, so the groups are final
    only = {"must": [{"key": "bucket", "match": {"value": 3}}]}
    matching = sum(d.metadata["bucket"] == 3 for d in documents)
    depths = [80 * 2 ** i for i in range(4)]  # 4 hits per place of 5 groups × 4, doubled each round
    rounds = next(i + 1 for i, depth in enumerate(depths) if depth > matching)
    answer = grouped(http, {"vector": query, "k": 5, "group_by": "kind", "group_size": 4, "filter": only,
                            "with_metadata": True})
    assert answer["diagnostics"]["groups"] == {"by": "kind", "size": 4, "groups": 3, "read": depths[rounds - 1],
                                               "rounds": rounds, "filled": True}
    assert len(answer["hits"]) == 12 and all(h["metadata"]["bucket"] == 3 for h in answer["hits"])
    # a key no document has: every round in vain, up to the cap
    answer = grouped(http, {"vector": query, "k": 3, "group_by": "missing"})
    assert answer["hits"] == []
    assert answer["diagnostics"]["groups"] == {"by": "missing", "size": 1, "groups": 0, "read": 1000, "rounds": 7,
                                               "filled": False}


@pytest.mark.parametrize("body, field", [
    ({"group_size": 2}, "group_size"),
    ({"group_by": ""}, "group_by"),
    ({"group_by": "bucket", "group_size": 101}, "group_size"),
    ({"group_by": "bucket", "group_size": 20, "k": 60}, "group_size"),
])
def test_refusals_name_the_field(cluster, body, field):
    http, _, corpus, _ = cluster
    response = http.post("/v1/query", json={"vector": corpus.query_vectors[0].tolist(), **body})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_shardrag_query_prints_the_groups_group_by_group(cluster):
    http, _, corpus, url = cluster
    text = next(iter(corpus.dataset.queries.values()))
    answer = grouped(http, {"text": text, "mode": "lexical", "k": 3, "group_by": "tags", "group_size": 2})
    printed = subprocess.run([sys.executable, "-m", "serving", "query", text, "--url", url, "--mode", "lexical",
                              "-k", "3", "--group-by", "tags", "--group-size", "2"],
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert lines[1] == "3 groups by tags, read 24 deep in 1 round(s)"
    headers = [line for line in lines if line.startswith("tags = ")]
    assert headers == [f'tags = "{h["group"]}"' for h in answer["hits"][::2]]


@pytest.mark.alone  # tests/sharing.py: a 300 ms shard under a 500 ms deadline
def test_a_deeper_round_that_misses_its_deadline_leaves_the_whole_round_before(cluster):
    """Shard 0 slowed to 300 ms (the shard server's fault injection) under a 500 ms deadline: the
    first round (80 deep) is whole, the second loses shard 0 to the deadline — the answer is the
    first round's groups, not filled, never a partial list or a 504."""
    http, documents, corpus, _ = cluster
    query = corpus.query_vectors[1]
    body = {"vector": query.tolist(), "k": 5, "group_by": "kind", "group_size": 4}
    assert http.put("/admin/faults/0/0", json={"spec": "latency=fixed:300"}).status_code == 200
    try:
        answer = grouped(http, {**body, "timeout_ms": 500})
    finally:
        assert http.delete("/admin/faults").status_code == 200
    assert not answer["partial"]
    assert answer["diagnostics"]["groups"] == {"by": "kind", "size": 4, "groups": 3, "read": 80, "rounds": 2,
                                               "filled": False}
    want = oracle(documents, corpus.vectors, query, "kind", 5, 4)
    assert [tagged(h["group"]) for h in answer["hits"]] == [group for group, _ in want]
