"""Writes through real processes: 2 shards × 3 replica processes with their own WALs, a gateway
with the real MiniLM. Upserts are visible to session reads at once, updates replace, deletes hide,
a bad batch applies nothing; a replica killed -9 comes back with its WAL replayed; a stopped
replica is skipped by session reads and catches up from a peer when it returns."""

from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.routing import hash_shard
from serving.local.launcher import LocalCluster

pytestmark = pytest.mark.slow
DOCS = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, msmarco):
    root = tmp_path_factory.mktemp("root")
    build_collection(root, msmarco.documents[:DOCS], msmarco.vectors[:DOCS], msmarco.version,
                     BuildConfig("live", 2), show_progress=False)
    with LocalCluster(root, "live", replicas=3, workdir=tmp_path_factory.mktemp("work")) as running:
        yield running


@pytest.fixture()
def http(cluster):
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
        yield client


def session(http, text: str, seq: dict, **extra) -> dict:
    response = http.post("/v1/query", json={"text": text, "k": 5, "consistency": "session", "min_seq": seq,
                                            "with_metadata": True, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns()}"


def test_upsert_update_delete_and_a_bad_batch(http):
    doc_id = unique("fresh")
    text = "zebras of the kalahari migrate across salt pans every winter"
    written = http.post("/v1/documents", json={"documents": [
        {"id": doc_id, "title": "Kalahari zebras", "text": text, "metadata": {"lang": "en", "year": 2024}}]})
    assert written.status_code == 200, written.text
    reply = written.json()
    assert reply["ids"] == [doc_id] and set(reply["seq"]) == {str(hash_shard(doc_id, 2))}
    hits = session(http, "zebra migration kalahari", reply["seq"])["hits"]
    assert hits[0]["doc_id"] == doc_id and hits[0]["metadata"] == {"lang": "en", "year": 2024}
    stored = http.get(f"/v1/documents/{doc_id}").json()
    assert stored["text"] == text and stored["metadata"]["year"] == 2024 and stored["seq"] >= 1

    updated = http.post("/v1/documents", json={"documents": [
        {"id": doc_id, "title": "Penguins", "text": "emperor penguins huddle through the antarctic night"}]}).json()
    results = session(http, "zebra migration kalahari", updated["seq"], k=10)["hits"]
    assert all(h["doc_id"] != doc_id or h["title"] == "Penguins" for h in results)  # the old text never again
    assert [h["doc_id"] for h in session(http, "penguins in the antarctic", updated["seq"])["hits"]][0] == doc_id

    deleted = http.post("/v1/documents/delete", json={"ids": [doc_id]}).json()
    assert doc_id not in [h["doc_id"] for h in session(http, "penguins in the antarctic", deleted["seq"])["hits"]]
    assert http.get(f"/v1/documents/{doc_id}").status_code == 404

    good = unique("good")
    refused = http.post("/v1/documents", json={"documents": [
        {"id": good, "text": "fine"}, {"id": unique("bad"), "text": "x", "metadata": {"deep": {"no": 1}}}]})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "documents[1].metadata.deep"
    assert http.get(f"/v1/documents/{good}").status_code == 404  # nothing of the batch was applied


def test_a_killed_replica_replays_its_wal(cluster, http):
    ids = [unique(f"replay-{i}") for i in range(20)]
    vectors = np.random.default_rng(0).standard_normal((20, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    reply = http.post("/v1/documents", json={"write_ack": "all", "documents": [
        {"id": doc_id, "vector": vector.tolist(), "metadata": {"n": i}}
        for i, (doc_id, vector) in enumerate(zip(ids, vectors, strict=True))]}).json()
    victim = cluster.shards[0][2]
    old_pid = victim.process.pid
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while victim.process.pid == old_pid or victim.ready is None:
        assert time.monotonic() < deadline, "the supervisor did not restart the replica"
        time.sleep(0.1)
    url = victim.ready["url"]
    info = httpx.get(f"{url}/v1/info", timeout=10).json()
    assert info["versions"][0]["applied_seq"] >= reply["seq"]["0"]  # replayed: nothing acknowledged is lost
    for doc_id in ids:
        if hash_shard(doc_id, 2) == 0:
            stored = httpx.get(f"{url}/v1/documents/{doc_id}", timeout=10).json()
            assert stored["id"] == doc_id


def test_a_stopped_replica_is_skipped_by_session_reads_then_catches_up(cluster, http):
    stopped = cluster.shards[1][1]
    doc_id = next(d for d in (unique(f"stop-{i}") for i in range(100)) if hash_shard(d, 2) == 1)
    os.kill(stopped.process.pid, signal.SIGSTOP)
    try:
        reply = http.post("/v1/documents", json={"documents": [  # majority: 2 of 3 are enough
            {"id": doc_id, "text": "the lighthouse keeper logged every passing ship in red ink"}]})
        assert reply.status_code == 200, reply.text
        seq = reply.json()["seq"]
        for _ in range(10):  # the stopped replica never answers a read that needs this write
            hits = session(http, "lighthouse keeper ship log", seq)["hits"]
            assert hits[0]["doc_id"] == doc_id
    finally:
        os.kill(stopped.process.pid, signal.SIGCONT)
    url = stopped.ready["url"]
    deadline = time.monotonic() + 30  # the gateway's repair loop brings it up from a peer's WAL
    while httpx.get(f"{url}/v1/info", timeout=10).json()["versions"][0].get("applied_seq", 0) < seq["1"]:
        assert time.monotonic() < deadline, "the stopped replica never caught up"
        time.sleep(0.2)
    assert httpx.get(f"{url}/v1/documents/{doc_id}", timeout=10).status_code == 200
