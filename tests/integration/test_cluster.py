"""A real local cluster: 3 kmeans shards × 2 replica processes + a gateway process on 127.0.0.1."""

import json
import os
import signal
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.oracle import ExactOracle, assert_same_ranking

pytestmark = pytest.mark.slow
NUM_SHARDS = 3


@pytest.fixture(scope="module")
def started(tmp_path_factory, msmarco):
    """(the cluster, the replicas that served while it was fresh). The spread is taken before any
    test of the module runs: after one kills a replica, the balancer rightly keeps that replica's
    failure penalty for about a minute (peak EWMA, 1 s penalty, 10 s decay), and at concurrency 1
    nothing sends it traffic sooner — a later check would only wait for that decay."""
    root = tmp_path_factory.mktemp("root")
    build_collection(root, msmarco.documents, msmarco.vectors, msmarco.version,
                     BuildConfig("msmarco", NUM_SHARDS, "kmeans", "Flat"), show_progress=False)
    with LocalCluster(root, "msmarco", replicas=2, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                      workdir=tmp_path_factory.mktemp("work")) as running:
        every_replica = {url for group in running.shard_urls for url in group}
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=running.gateway_url, timeout=30) as http:
            while seen != every_replica and time.monotonic() < deadline:
                body = http.post("/v1/query", json={"vector": msmarco.query_vectors[0].tolist(), "k": 10}).json()
                seen.update(call["replica"] for call in body["diagnostics"]["per_shard"])
        yield running, seen


@pytest.fixture(scope="module")
def cluster(started):
    return started[0]


@pytest.fixture(scope="module")
def http(cluster):
    with httpx.Client(base_url=cluster.gateway_url, timeout=30) as client:
        yield client


def test_real_processes_match_unsharded_exact(cluster, started, http, msmarco):
    oracle = ExactOracle([d.doc_id for d in msmarco.documents], msmarco.vectors)
    for query_vector in msmarco.query_vectors:
        body = http.post("/v1/query", json={"vector": query_vector.tolist(), "k": 10}).json()
        assert_same_ranking([(h["doc_id"], h["score"]) for h in body["hits"]], oracle.top_k(query_vector, 10))
        diagnostics = body["diagnostics"]
        assert diagnostics["shards_answered"] == NUM_SHARDS
        # the per-hop timings add up: each replica's own search fits inside the gateway's timing
        # of its call, and the fan-out inside the query (benchmarks/query_profile.py reads these)
        for call in diagnostics["per_shard"]:
            assert 0.0 < call["server_ms"] <= call["latency_ms"]
        assert max(c["latency_ms"] for c in diagnostics["per_shard"]) <= diagnostics["fanout_ms"]
        assert diagnostics["fanout_ms"] <= diagnostics["took_ms"]
        routed = http.post("/v1/query", json={"vector": query_vector.tolist(), "k": 10, "top_m": NUM_SHARDS}).json()
        assert routed["hits"] == body["hits"]
    # Every replica serves: the balancer spread a fresh cluster's queries over all of them.
    assert started[1] == {url for group in cluster.shard_urls for url in group}


def test_shard_server_bad_input(cluster, msmarco):
    url = cluster.shard_urls[0][0]
    version = msmarco.version.id
    good = msmarco.query_vectors[:2].astype("<f4").tobytes()
    nan = msmarco.query_vectors[:1].copy()
    nan[0, 3] = np.nan
    cases = [
        (f"/v1/search?k=5&version={version}", good[:-4], 422, "body"),
        (f"/v1/search?k=5&version={version}", b"", 400, "body"),
        (f"/v1/search?k=5&version={version}", nan.astype("<f4").tobytes(), 422, "body"),
        (f"/v1/search?k=0&version={version}", good, 422, "k"),
        (f"/v1/search?k=100000&version={version}", good, 422, "k"),
        (f"/v1/search?k=ten&version={version}", good, 422, "k"),
        (f"/v1/search?k=5&version={version}&nprobe=4", good, 422, "nprobe"),
        ("/v1/search?k=5&version=not-this-one", good, 409, "version"),
        (f"/v1/search?k=5&version={version}", b"\0" * (17 * 1024 * 1024), 413, "body"),
    ]
    with httpx.Client(base_url=url, timeout=30) as shard:
        for path, body, status, field in cases:
            response = shard.post(path, content=body, headers={"content-type": "application/octet-stream"})
            assert response.status_code == status, (path, response.text)
            assert response.json()["error"]["field"] == field
        ok = shard.post(f"/v1/search?k=5&version={version}", content=good)
        assert ok.status_code == 200 and len(ok.json()["results"]) == 2
        info = shard.get("/v1/info").json()
        [held] = info["versions"]
        assert (held["id"], held["state"], held["count"]) == (version, "ready", info["count"])
        assert info["dim"] == 384 and info["factory"] == "Flat" and len(info["centroid"]) == 384
        assert "shardrag_shard_search_latency_seconds" in shard.get("/metrics").text
        assert shard.get("/healthz").json()["status"] == "ok"


def test_gateway_bad_input_over_real_http(http):
    assert http.post("/v1/query", json={"vector": [0.1] * 383}).json()["error"]["field"] == "vector"
    response = http.post("/v1/query", content=b'{"vector": [0.1,', headers={"content-type": "application/json"})
    assert response.status_code == 400
    response = http.post("/v1/query", content=b"x" * (2 << 20), headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["field"] == "body"
    assert http.post("/v1/query", json={"text": "hello"}).status_code == 503  # started without an encoder
    assert http.get("/healthz").json()["status"] == "ok"


@pytest.mark.parametrize("client", ["urllib", "httpx", "curl"])
def test_every_common_client_reads_the_413_of_an_oversize_body(cluster, client):
    """A 24 MB query body (the limit is 1 MB): the gateway drains it and answers 413 naming the
    field — also to clients that send the whole body before reading (urllib), which got a
    connection reset before (2 MB fits in loopback's socket buffers here; 24 MB does not)."""
    import shutil
    import subprocess
    import urllib.error
    import urllib.request

    url, body = f"{cluster.gateway_url}/v1/query", b"x" * (24 << 20)
    if client == "urllib":
        request = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        status, payload = caught.value.code, json.loads(caught.value.read())
    elif client == "httpx":
        response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
        status, payload = response.status_code, response.json()
    else:
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        done = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-H", "content-type: application/json",
                               "--data-binary", "@-", url], input=body, capture_output=True, timeout=30, check=True)
        text, _, code = done.stdout.decode().rpartition("\n")
        status, payload = int(code), json.loads(text)
    assert status == 413 and payload["error"]["field"] == "body" and payload["error"]["code"] == "payload_too_large"


def test_cluster_endpoint(http, msmarco):
    cluster = http.get("/v1/cluster").json()
    assert cluster["num_shards"] == NUM_SHARDS and cluster["partitioner"] == "kmeans"
    assert cluster["embedding_version"]["id"] == msmarco.version.id
    for shard in cluster["shards"]:
        assert shard["healthy_replicas"] == 2
        assert all(r["versions"][0]["id"] == msmarco.version.id for r in shard["replicas"])
        assert all(r["versions"][0]["state"] == "ready" for r in shard["replicas"])
    assert "shardrag_gateway_shard_call_latency_seconds" in http.get("/metrics").text


def test_killed_replica_is_survived_and_restarted(cluster, http, msmarco):
    victim = cluster.shards[1][0]
    old_pid, port = victim.process.pid, victim.port
    os.kill(old_pid, signal.SIGKILL)
    vector = msmarco.query_vectors[0].tolist()
    for _ in range(10):  # every query still answered: the other replica takes over
        body = http.post("/v1/query", json={"vector": vector, "k": 10}).json()
        assert body["diagnostics"]["shards_answered"] == NUM_SHARDS
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if victim.restarts >= 1 and victim.ready is not None and victim.process.pid != old_pid:
            break
        time.sleep(0.1)
    assert victim.restarts >= 1 and victim.process.pid != old_pid
    assert victim.port == port  # back on its old address, so the gateway finds it
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200


def test_stop_ends_every_process(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents[:300], msmarco.vectors[:300], msmarco.version,
                     BuildConfig("small", 2), show_progress=False)
    cluster = LocalCluster(root, "small", replicas=1, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                           workdir=tmp_path / "work").start()
    processes = [child.process for child in cluster.children()]
    assert all(p.poll() is None for p in processes)
    cluster.stop()
    assert all(p.poll() is not None for p in processes)
