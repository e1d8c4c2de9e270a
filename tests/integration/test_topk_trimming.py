"""Per-shard top-k trimming through real processes on msmarco + dbpedia (10k real MiniLM vectors):
every query's answer equals the full-k fan-out's (``exact: true``) at 4 and 8 shards, hits and
scores bit for bit, while each shard is asked for fewer hits; HNSW shards are trimmed only with
an explicit ef_search ≥ k (a smaller k would narrow their beam); fast-scan PQ shards exactly too;
refined shards never (their shorter lists are not prefixes), with the reason in the diagnostics."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from serving.shardcall.fanout import trimmed_k
from tests.conftest import REPORT

pytestmark = pytest.mark.slow
# every query here is a vector: the gateway needs no query encoder (loading one costs each cluster
# start seconds of CPU on 2 cores)
VECTORS_ONLY = {"encoder": {"load": False}}


def test_trimmed_k_follows_the_binomial_tail():
    assert trimmed_k(100, 4, 0.9999) == 42 and trimmed_k(100, 8, 0.9999) == 25
    assert trimmed_k(10, 4, 0.9999) == 8 and trimmed_k(10, 1, 0.9999) == 10 and trimmed_k(100, 4, 0.0) == 100
    assert trimmed_k(3, 64, 0.9999) >= 1 and trimmed_k(1000, 2, 0.9999) < 1000


@pytest.fixture(scope="module")
def corpus(msmarco, dbpedia):
    documents = msmarco.documents + dbpedia.documents
    vectors = np.concatenate([msmarco.vectors, dbpedia.vectors])
    queries = np.concatenate([msmarco.query_vectors, dbpedia.query_vectors])
    return documents, vectors, queries, msmarco.version


def answers(client: httpx.Client, queries: np.ndarray, k: int, **extra) -> list[dict]:
    out = []
    for q in queries:
        response = client.post("/v1/query", json={"vector": q.tolist(), "k": k, "with_text": False, **extra})
        assert response.status_code == 200, response.text
        out.append(response.json())
    return out


def hits(answer: dict) -> list[tuple[str, float]]:
    return [(h["doc_id"], h["score"]) for h in answer["hits"]]


@pytest.mark.parametrize("shards", [4, 8])
def test_trimmed_answers_equal_the_full_k_fan_out(tmp_path, corpus, shards):
    documents, vectors, queries, version = corpus
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("trim", shards), show_progress=False)
    with LocalCluster(tmp_path / "root", "trim", replicas=1, gateway=GatewayConfig.from_dict(VECTORS_ONLY),
                      workdir=tmp_path / "run") as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=30) as client:
        for k in (10, 100):
            trimmed, full = answers(client, queries, k), answers(client, queries, k, exact=True)
            assert all(hits(a) == hits(b) and len(hits(a)) == k for a, b in zip(trimmed, full, strict=True))
            assert {a["diagnostics"]["shard_k"] for a in trimmed} == {trimmed_k(k, shards, 0.9999)} != {k}
            assert {b["diagnostics"]["shard_k"] for b in full} == {k}
            assert {a["diagnostics"]["trimming"] for a in trimmed} == {"on"}
            again = sum(len(a["diagnostics"]["second_round"]) for a in trimmed)
            REPORT.append(f"top-k trimming, {shards} shards, k={k}: each shard asked for "
                          f"{trimmed_k(k, shards, 0.9999)}; {len(queries)} queries identical to full k, "
                          f"{again} second-round shard calls")


def test_second_rounds_restore_what_trimming_held_back(tmp_path, corpus):
    """At probability 0.5 (z = 0) each shard is asked for just k/n hits, so many shards hold more
    of the top k than that: they are asked again, and every answer is still the full-k one."""
    documents, vectors, queries, version = corpus
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("half", 4), show_progress=False)
    config = GatewayConfig.from_dict({"calls": {"topk_probability": 0.5}, **VECTORS_ONLY})
    with LocalCluster(tmp_path / "root", "half", replicas=1, gateway=config, workdir=tmp_path / "run") as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=30) as client:
        trimmed, full = answers(client, queries, 100), answers(client, queries, 100, exact=True)
    assert {a["diagnostics"]["shard_k"] for a in trimmed} == {25}
    again = [len(a["diagnostics"]["second_round"]) for a in trimmed]
    assert sum(again) > len(queries) // 2  # most queries needed a second round on some shard
    assert all(hits(a) == hits(b) for a, b in zip(trimmed, full, strict=True))


def test_hnsw_is_trimmed_only_with_an_explicit_ef_search(tmp_path, corpus):
    documents, vectors, queries, version = corpus
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("hnsw", 4, factory="HNSW32"),
                     show_progress=False)
    with LocalCluster(tmp_path / "root", "hnsw", replicas=1, gateway=GatewayConfig.from_dict(VECTORS_ONLY),
                      workdir=tmp_path / "run") as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=30) as client:
        plain = answers(client, queries[:10], 50)
        assert {a["diagnostics"]["shard_k"] for a in plain} == {50}
        assert all(a["diagnostics"]["trimming"].startswith("off: HNSW") for a in plain)
        wide = answers(client, queries, 50, ef_search=128)
        full = answers(client, queries, 50, ef_search=128, exact=True)
    assert {a["diagnostics"]["shard_k"] for a in wide} == {trimmed_k(50, 4, 0.9999)}
    assert all(hits(a) == hits(b) for a, b in zip(wide, full, strict=True))


@pytest.mark.parametrize("shards, factory, trimmed", [(4, "IVF64,PQ16x4fs", True), (8, "IVF64,PQ16x4fs", True),
                                                      (4, "IVF64,PQ16x4fs,RFlat", False),
                                                      (8, "IVF64,PQ16x4fs,RFlat", False)])
def test_fast_scan_is_trimmed_exactly_and_refined_shards_never_saying_why(tmp_path, corpus, shards, factory, trimmed):
    """Fast-scan PQ shards: trimmed, and every answer equals the full-k one (their shorter lists
    differ from the full ones only among equal scores: tests/unit/serving/test_trimming_rules.py).
    Refined shards: a shorter list re-ranks fewer candidates, so the fan-out asks every shard for the
    full k and the diagnostics say why. (One node hosts every shard: one process to start.)"""
    documents, vectors, queries, version = corpus
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("fs", shards, factory=factory),
                     show_progress=False)
    with LocalCluster(tmp_path / "root", "fs", replicas=1, layout="nodes",
                      gateway=GatewayConfig.from_dict(VECTORS_ONLY), workdir=tmp_path / "run") as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=30) as client:
        # nprobe 8: enough IVF lists that every shard has its k (the build's default of 1 may not)
        plain, full = answers(client, queries, 100, nprobe=8), answers(client, queries, 100, nprobe=8, exact=True)
    assert all(hits(a) == hits(b) and len(hits(a)) == 100 for a, b in zip(plain, full, strict=True))
    reasons = {a["diagnostics"]["trimming"] for a in plain}
    if trimmed:
        assert reasons == {"on"} and {a["diagnostics"]["shard_k"] for a in plain} == {trimmed_k(100, shards, 0.9999)}
    else:
        assert {a["diagnostics"]["shard_k"] for a in plain} == {100}
        assert len(reasons) == 1 and reasons.pop().startswith(f"off: {factory}: ")
    assert {b["diagnostics"]["trimming"] for b in full} == {"off: exact asked for"}
    REPORT.append(f"top-k trimming, {shards} shards of {factory}: {'trimmed' if trimmed else 'never trimmed'}; "
                  f"{len(queries)} queries identical to exact, k=100, "
                  f"{sum(len(a['diagnostics']['second_round']) for a in plain)} second-round shard calls")
