"""Writes through real processes: 2 shards × 3 replica processes with their own WALs, a gateway
with the real MiniLM. Upserts are visible to session reads at once, updates replace, deletes hide,
a bad batch applies nothing; a replica killed -9 comes back with its WAL replayed; a stopped
replica is skipped by session reads and is caught up by its shard's primary when it returns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.routing import hash_shard
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.roles import primary_index, wait_all_in_sync

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


def session(http, text: str, seq: dict, term: dict | None = None, **extra) -> dict:
    floor = {"min_seq": seq, **({"min_term": term} if term is not None else {})}
    response = http.post("/v1/query", json={"text": text, "k": 5, "consistency": "session", **floor,
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
    urls = cluster.shard_urls[0]
    victim = cluster.shards[0][(primary_index(urls) + 1) % 3]  # a replica, not the primary (tested elsewhere)
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
    stopped = cluster.shards[1][(primary_index(cluster.shard_urls[1]) + 1) % 3]
    doc_id = next(d for d in (unique(f"stop-{i}") for i in range(100)) if hash_shard(d, 2) == 1)
    os.kill(stopped.process.pid, signal.SIGSTOP)
    try:
        reply = http.post("/v1/documents", json={"documents": [  # majority: 2 of 3 are enough
            {"id": doc_id, "text": "the lighthouse keeper logged every passing ship in red ink"}]})
        assert reply.status_code == 200, reply.text
        seq, term = reply.json()["seq"], reply.json()["term"]
        assert set(term) == set(seq) == {"1"} and term["1"] >= 1
        for _ in range(10):  # the stopped replica never answers a read that needs this write
            hits = session(http, "lighthouse keeper ship log", seq, term)["hits"]
            assert hits[0]["doc_id"] == doc_id
    finally:
        os.kill(stopped.process.pid, signal.SIGCONT)
    url = stopped.ready["url"]
    deadline = time.monotonic() + 30  # the shard's primary brings it back in from its own WAL
    while httpx.get(f"{url}/v1/info", timeout=10).json()["versions"][0].get("applied_seq", 0) < seq["1"]:
        assert time.monotonic() < deadline, "the stopped replica never caught up"
        time.sleep(0.2)
    assert httpx.get(f"{url}/v1/documents/{doc_id}", timeout=10).status_code == 200


def test_delete_by_filter_and_get_metadata(http):
    tag = unique("tenant")
    docs = [{"id": f"{tag}-{i}", "text": f"invoice number {i} for the tenant", "metadata": {"tenant": tag, "n": i}}
            for i in range(6)]
    written = http.post("/v1/documents", json={"documents": docs, "write_ack": "all"})
    assert written.status_code == 200, written.text
    only = {"must": [{"key": "tenant", "match": {"value": tag}}]}
    found = session(http, "invoice for the tenant", written.json()["seq"], k=10, filter=only)["hits"]
    assert sorted(h["doc_id"] for h in found) == sorted(d["id"] for d in docs)
    partial = {"must": [{"key": "tenant", "match": {"value": tag}}, {"key": "n", "range": {"gte": 3}}]}
    deleted = http.post("/v1/documents/delete", json={"filter": partial, "write_ack": "all"})
    assert deleted.status_code == 200, deleted.text
    assert sorted(deleted.json()["ids"]) == [f"{tag}-{i}" for i in (3, 4, 5)]
    left = session(http, "invoice for the tenant", deleted.json()["seq"], k=10, filter=only)["hits"]
    assert sorted(h["doc_id"] for h in left) == [f"{tag}-{i}" for i in (0, 1, 2)]
    assert http.get(f"/v1/documents/{tag}-4").status_code == 404
    assert http.get(f"/v1/documents/{tag}-1").json()["metadata"] == {"tenant": tag, "n": 1}
    nothing = http.post("/v1/documents/delete", json={"filter": partial})
    assert nothing.status_code == 200 and nothing.json()["ids"] == []


@pytest.mark.parametrize("body, status, field", [
    ({"documents": [{"id": "a", "vector": [0.1] * 383}]}, 422, "documents[0].vector"),
    ({"documents": [{"id": "a", "vector": [0.1] * 383 + ["x"]}]}, 422, "documents.0.vector.383"),
    ({"documents": [{"id": "", "text": "x"}]}, 422, "documents.0.id"),
    ({"documents": [{"id": " ", "text": "x"}]}, 422, "documents[0].id"),
    ({"documents": [{"id": "\x1e", "text": "x"}]}, 422, "documents[0].id"),  # blank to Python, not to ECMA's \s
    ({"documents": [{"id": "a", "text": "\ufeff"}]}, 422, "documents[0].text"),  # blank to ECMA's \s only
    ({"ids": ["a", "\x1c\x85"]}, 422, "ids[1]"),
    ({"documents": [{"id": "k" * 1024, "text": "x"}]}, 422, "documents.0.id"),
    ({"documents": [{"id": "a", "text": "x", "metadata": ["not", "an", "object"]}]}, 422, "documents.0.metadata"),
    ({"documents": [{"id": "a", "text": "x", "metadata": {"a": {"b": {"c": 1}}}}]}, 422, "documents[0].metadata.a"),
    ({"documents": [{"id": "a", "text": " ", "vector": [0.1] * 384}]}, 422, "documents[0].text"),
    ({"documents": [{"id": "a"}]}, 422, "documents[0].text"),
    ({"documents": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}, 422, "documents[1].id"),
    ({"documents": [{"id": "a", "text": "x"}], "write_ack": "some"}, 422, "write_ack"),
    ({"documents": []}, 422, "documents"),
    ({"ids": ["a"], "filter": {"must": []}}, 422, "ids"),
    ({"filter": {"must": [{"key": "n", "near": {"value": 1}}]}}, 422, "filter.must[0]"),
    ({"filter": {"must": [{"key": "n", "range": {"gte": "2020"}}]}}, 422, "filter.must[0].range.gte"),
    ({"filter": {}}, 422, "filter"),
    ({"ids": ["a", "a"]}, 422, "ids[1]"),
])
def test_bad_writes_are_refused_naming_the_field(http, body, status, field):
    path = "/v1/documents/delete" if "documents" not in body else "/v1/documents"
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"].startswith(field), response.json()


@pytest.mark.parametrize("body, field", [
    ({"min_term": {"0": 1}}, "min_term"),  # without consistency: session
    ({"consistency": "session", "min_seq": {"0": 1}, "min_term": {"7": 1}}, "min_term.7"),
    ({"consistency": "session", "min_seq": {"0": 1}, "min_term": {"0": -1}}, "min_term.0"),
    ({"consistency": "session", "min_seq": {"x": 1}}, "min_seq.x"),
])
def test_bad_session_reads_are_refused_naming_the_field(http, body, field):
    response = http.post("/v1/query", json={"text": "anything", **body})
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["field"] == field, response.json()


def test_nan_and_huge_documents_are_refused(http):
    nan = http.post("/v1/documents", content=b'{"documents": [{"id": "n", "vector": [NaN' + b', 0.0' * 383 + b']}]}',
                    headers={"content-type": "application/json"})
    assert 400 <= nan.status_code < 500 and nan.status_code != 404, nan.text
    huge = http.post("/v1/documents", json={"documents": [{"id": "big", "text": "word " * 2_000_000}]})
    assert huge.status_code == 413 or (huge.status_code == 422 and "documents" in huge.json()["error"]["field"])
    assert http.get("/v1/documents/big").status_code == 404 and http.get("/v1/documents/n").status_code == 404


def test_a_replica_that_crashes_between_wal_append_and_ack_keeps_the_write(cluster, http):
    victim = cluster.shards[0][(primary_index(cluster.shard_urls[0]) + 1) % 3]
    old_pid = victim.process.pid
    url = victim.ready["url"]
    assert httpx.put(f"{url}/admin/faults", json={"crash_at": "after_wal_append"}, timeout=10).status_code == 200
    doc_id = next(d for d in (unique(f"crash-{i}") for i in range(100)) if hash_shard(d, 2) == 0)
    reply = http.post("/v1/documents", json={"documents": [{"id": doc_id, "text": "a durable write survives"}]})
    assert reply.status_code == 200, reply.text  # the two other replicas acknowledged: majority
    deadline = time.monotonic() + 60
    while victim.process.pid == old_pid or victim.ready is None:
        assert time.monotonic() < deadline, "the supervisor did not restart the crashed replica"
        time.sleep(0.1)
    stored = httpx.get(f"{victim.ready['url']}/v1/documents/{doc_id}", timeout=10)
    assert stored.status_code == 200, stored.text  # replayed from its WAL: fsynced before the crash
    assert stored.json()["seq"] == reply.json()["seq"]["0"]
    wait_all_in_sync(cluster.shard_urls[0])  # and it is brought back into the in-sync set


@pytest.mark.alone  # tests/sharing.py: no query under its load may miss the default 5 s deadline
def test_compaction_under_query_load_changes_no_answer(cluster, http, msmarco):
    ids = [unique(f"compact-{i}") for i in range(40)]
    written = http.post("/v1/documents", json={"write_ack": "all", "documents": [
        {"id": doc_id, "text": msmarco.documents[700 + i].text, "metadata": {"i": i}} for i, doc_id in
        enumerate(ids)]}).json()
    http.post("/v1/documents/delete", json={"ids": [msmarco.documents[i].doc_id for i in range(10)],
                                            "write_ack": "all"})
    queries = [msmarco.dataset.queries[q] for q in msmarco.query_ids[:20]]

    def answers():
        # ids by score, ties (documents written with the same vector) in id order: the segment and the
        # compacted index may round an equal score differently in the last float32 bit
        out = []
        for q in queries:
            hits = sorted((-round(h["score"], 4), h["doc_id"]) for h in session(http, q, written["seq"], k=10)["hits"])
            last = hits[-1][0]  # which twin of a tie at the 10th place makes the cut is arbitrary
            out.append(([score for score, _ in hits], [hit for hit in hits if hit[0] != last]))
        return out

    before = answers()
    errors, served = [], [0]
    stop = threading.Event()

    def load():
        with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
            while not stop.is_set():
                r = client.post("/v1/query", json={"text": queries[served[0] % len(queries)], "k": 10})
                served[0] += 1
                if r.status_code != 200 or r.json()["partial"]:
                    errors.append(r.text)

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    def served_at_least(count: int) -> None:
        deadline = time.monotonic() + 60
        while served[0] < count and time.monotonic() < deadline:
            time.sleep(0.05)

    try:
        served_at_least(10)  # queries running before, during and after the compactions
        for row in cluster.shards:
            for replica in row:
                done = httpx.post(f"{replica.ready['url']}/admin/compact", timeout=120)
                assert done.status_code == 200, done.text
                assert done.json()["compacted"] > 0 or done.json()["base_seq"] > 0
        served_at_least(served[0] + 10)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert served[0] >= 20 and errors == []
    assert answers() == before
    for row in cluster.shards:
        info = httpx.get(f"{row[0].ready['url']}/v1/info", timeout=10).json()["versions"][0]
        assert info["segment"] == 0 and info["tombstones"] == 0


def test_shardrag_ingest_is_resumable_and_never_applies_a_batch_twice(cluster, http, tmp_path, msmarco):
    corpus = tmp_path / "new.jsonl"
    prefix = unique("ingest")
    rows = [{"_id": f"{prefix}-{i}", "title": f"t{i}", "vector": msmarco.vectors[i].tolist(), "metadata": {"i": i}}
            for i in range(400)]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    progress = tmp_path / "progress.json"
    command = [str(Path(sys.executable).with_name("shardrag")), "ingest", "--url", cluster.gateway_url,
               "--collection", "live", "--corpus", str(corpus), "--batch", "20", "--progress", str(progress),
               "--quiet"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not progress.exists() or json.loads(progress.read_text())["acknowledged"] < 60:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.02)
    first.kill()  # interrupted mid-stream
    first.wait()
    acknowledged = json.loads(progress.read_text())["acknowledged"]
    assert 60 <= acknowledged < 400
    second = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["acknowledged"] == 400 and summary["sent"] <= 400 - acknowledged + 20  # at most one batch again
    assert "resuming" in second.stderr
    again = json.loads(subprocess.run(command, capture_output=True, text=True, timeout=120).stdout.splitlines()[-1])
    assert again["sent"] == 0
    for i in (0, 199, 399):
        assert http.get(f"/v1/documents/{prefix}-{i}").json()["metadata"] == {"i": i}
    wrong = subprocess.run([*command[:3], cluster.gateway_url, "--collection", "other", "--corpus", str(corpus)],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0 and "serves collection 'live'" in wrong.stderr


def test_a_crash_during_compaction_loses_nothing_and_rejoins(cluster, http):
    ids = [unique(f"midcompact-{i}") for i in range(30)]
    vectors = np.random.default_rng(4).standard_normal((30, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # unit length, like every other document
    http.post("/v1/documents", json={"write_ack": "all", "documents": [
        {"id": doc_id, "vector": v.tolist()} for doc_id, v in zip(ids, vectors, strict=True)]})
    row = cluster.shards[1]
    primary = primary_index(cluster.shard_urls[1])
    victim, peer_child = row[(primary + 1) % 3], row[primary]
    old_pid = victim.process.pid
    url = victim.ready["url"]
    assert httpx.put(f"{url}/admin/faults", json={"crash_at": "mid_compaction"}, timeout=10).status_code == 200
    with pytest.raises(httpx.HTTPError):  # the replica dies with the new base written, no checkpoint yet
        httpx.post(f"{url}/admin/compact", timeout=60)
    deadline = time.monotonic() + 60
    while victim.process.pid == old_pid or victim.ready is None:
        assert time.monotonic() < deadline, "the supervisor did not restart the replica"
        time.sleep(0.1)
    peer = httpx.get(f"{peer_child.ready['url']}/admin/digest", timeout=30).json()
    while True:  # the restarted replica holds exactly what its peer holds (a newer write may still arrive)
        mine = httpx.get(f"{victim.ready['url']}/admin/digest", timeout=30).json()
        if mine["applied_seq"] >= peer["applied_seq"]:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    peer = httpx.get(f"{peer_child.ready['url']}/admin/digest", timeout=30).json()
    assert (mine["count"], mine["sha256"]) == (peer["count"], peer["sha256"])
    done = httpx.post(f"{victim.ready['url']}/admin/compact", timeout=60)  # and it compacts fine now
    assert done.status_code == 200 and done.json()["base_seq"] == mine["applied_seq"]


def test_the_python_client_writes_reads_and_deletes(cluster):
    from retrieval.client import ShardragClient
    from retrieval.errors import InvalidRequest, NotFound, VersionConflict

    doc_id = unique("client")
    with ShardragClient(cluster.gateway_url) as client:
        reply = client.upsert([{"id": doc_id, "title": "Glaciers", "text": "glaciers carve fjords over millennia",
                                "metadata": {"kind": "geo"}}], write_ack="all", idempotency_key=doc_id)
        again = [{"id": doc_id, "title": "Glaciers", "text": "glaciers carve fjords over millennia",
                  "metadata": {"kind": "geo"}}]
        assert client.upsert(again, write_ack="all", idempotency_key=doc_id) == reply  # a retry: the first reply
        with pytest.raises(VersionConflict) as reused:  # new content under a used key is refused, not dropped
            client.upsert([{"id": doc_id, "text": "other content"}], idempotency_key=doc_id)
        assert reused.value.field == "idempotency_key"
        hits = client.query(text="how are fjords formed", k=3, min_seq=reply["seq"], min_term=reply["term"],
                            with_metadata=True,
                            filter={"must": [{"key": "kind", "match": {"value": "geo"}}]})["hits"]
        assert [h["doc_id"] for h in hits] == [doc_id] and hits[0]["metadata"] == {"kind": "geo"}
        assert client.get(doc_id)["text"] == "glaciers carve fjords over millennia"
        with pytest.raises(InvalidRequest) as bad:
            client.upsert([{"id": doc_id, "text": " ", "vector": [0.1] * 384}])
        assert bad.value.field == "documents[0].text"
        # text and a vector: the vector is used as given, the text stored beside it (not embedded)
        given = np.zeros(384, dtype=np.float32)
        given[7] = 1.0
        both = client.upsert([{"id": f"{doc_id}-v", "text": "a passage embedded elsewhere", "vector": given.tolist()}])
        assert client.get(f"{doc_id}-v")["text"] == "a passage embedded elsewhere"
        nearest = client.query(vector=given.tolist(), k=1, min_seq=both["seq"], min_term=both["term"])["hits"]
        assert nearest[0]["doc_id"] == f"{doc_id}-v" and nearest[0]["text"] == "a passage embedded elsewhere"
        client.delete([f"{doc_id}-v"])
        deleted = client.delete([doc_id])
        assert deleted["ids"] == [doc_id]
        with pytest.raises(NotFound):
            client.get(doc_id)


def test_kmeans_routing_moves_an_id_without_duplicating_it(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents[:300], msmarco.vectors[:300], msmarco.version,
                     BuildConfig("regions", 2, partitioner="kmeans"), show_progress=False)
    config = GatewayConfig.from_dict({"encoder": {"load": False}})
    with LocalCluster(root, "regions", replicas=1, gateway=config, workdir=tmp_path / "work") as running, \
            httpx.Client(base_url=running.gateway_url, timeout=60) as client:
        centroids = []
        for row in running.shards:
            info = httpx.get(f"{row[0].ready['url']}/v1/info", timeout=10).json()["versions"][0]
            centroid = np.asarray(info["centroid"], dtype=np.float32)
            centroids.append(centroid / np.linalg.norm(centroid))
        doc_id = "wanderer"
        homes = []
        for target in (0, 1, 0):
            reply = client.post("/v1/documents", json={"write_ack": "all", "documents": [
                {"id": doc_id, "vector": centroids[target].tolist(), "metadata": {"home": target}}]}).json()
            assert set(reply["seq"]) == {"0", "1"}  # the home shard's upsert and the other's delete
            holders = [s for s, row in enumerate(running.shards)
                       if httpx.get(f"{row[0].ready['url']}/v1/documents/{doc_id}", timeout=10).status_code == 200]
            homes.append(holders)
            hits = client.post("/v1/query", json={"vector": centroids[target].tolist(), "k": 20, "top_m": 2,
                                                  "consistency": "session", "min_seq": reply["seq"]}).json()["hits"]
            assert [h["doc_id"] for h in hits].count(doc_id) == 1
        assert homes == [[0], [1], [0]]  # always exactly one shard holds it: the nearest centroid's


def test_a_replica_behind_the_wal_retention_is_restored_from_a_snapshot(tmp_path, msmarco):
    """One replica stopped while its peers take 400 writes, compact every 50 and keep no WAL
    behind their checkpoints (small WAL files, --wal-retain 0), then killed (the writes queued on
    its sockets die with it): what it missed exists only in its peers' bases. When the supervisor
    restarts it, the shard's primary restores it from its snapshot and it catches up from there —
    identical documents, bit for bit — then takes writes, and survives another kill -9. And a
    replica freshly restored answers a catch-up read it cannot serve with 404, not with nothing
    (issue 33, item 8)."""
    root = tmp_path / "root"
    build_collection(root, msmarco.documents[:200], msmarco.vectors[:200], msmarco.version,
                     BuildConfig("snap", 1), show_progress=False)
    config = GatewayConfig.from_dict({"encoder": {"load": False}})
    rng = np.random.default_rng(7)

    def batch(start: int, count: int) -> list[dict]:
        vectors = rng.standard_normal((count, msmarco.vectors.shape[1])).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return [{"id": f"s-{start + i}", "title": f"t{start + i}", "vector": v.tolist(), "metadata": {"n": start + i}}
                for i, v in enumerate(vectors)]

    with LocalCluster(root, "snap", replicas=3, gateway=config, workdir=tmp_path / "work",
                      shard_args=("--compact-after", "50", "--wal-retain", "0", "--wal-file-mb", "0.01")) as running, \
            httpx.Client(base_url=running.gateway_url, timeout=60) as client:
        primary = primary_index(running.shard_urls[0])
        behind = running.shards[0][(primary + 1) % 3]
        peers = [running.shard_urls[0][primary]]
        os.kill(behind.process.pid, signal.SIGSTOP)
        try:
            for start in range(0, 400, 20):
                assert client.post("/v1/documents", json={"documents": batch(start, 20)}).status_code == 200
            deleted = client.post("/v1/documents/delete", json={"ids": [f"s-{i}" for i in range(0, 400, 7)]})
            assert deleted.status_code == 200, deleted.text
            # the peers have compacted away the first writes: only a snapshot can bring it back
            assert httpx.get(f"{peers[0]}/v1/writes", params={"version": msmarco.version.id, "after": 0},
                             timeout=10).status_code == 404
        finally:
            os.kill(behind.process.pid, signal.SIGKILL)

        def digests() -> list[dict]:
            return [httpx.get(f"{url}/admin/digest", timeout=30).json() for url in running.shard_urls[0]]

        def converged(what: str) -> None:
            deadline = time.monotonic() + 90  # restart, then the gateway's repair loop
            while True:
                try:
                    found = digests()  # a replica being restarted is not listed yet: wait for all three
                    if len(found) == 3 and len({d["sha256"] for d in found}) == 1:
                        return
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, what
                time.sleep(0.5)

        converged("the replica behind the WAL retention was never restored")
        assert "restored from a peer's snapshot" in Path(behind.log_path).read_text()
        restored = behind.ready["url"]  # it holds no log before the snapshot: a catch-up read from 0 is a 404
        assert httpx.get(f"{restored}/v1/writes", params={"version": msmarco.version.id, "after": 0},
                         timeout=10).status_code == 404
        more = client.post("/v1/documents", json={"documents": batch(1000, 20), "write_ack": "all"})
        assert more.status_code == 200, more.text
        assert len({d["sha256"] for d in digests()}) == 1
        os.kill(behind.process.pid, signal.SIGKILL)  # restart: the snapshot's base + the WAL after it
        converged("the restored replica did not come back after kill -9")
        assert digests()[0]["count"] == 200 + 400 - len(range(0, 400, 7)) + 20
