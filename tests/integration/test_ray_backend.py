"""The Ray backend on a local Ray (2 CPUs): 2 shards × 2 replica actors behind the same gateway
code as HTTP. Same answers as the HTTP backend; a killed replica actor costs no query; writes go
through each shard's primary actor to the others (the same protocol as HTTP, over Ray) and go on
when the primary actor is killed; clean shutdown."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from index_shards.build import BuildConfig, build_collection
from serving.gateway.api_models import QueryRequest
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig
from serving.gateway.factory import GatewaySetup
from serving.local.launcher import LocalCluster
from serving.transport.ray import RayShardCluster
from tests.conftest import random_corpus

# alone (tests/sharing.py): a Ray cluster (one per machine)
pytestmark = [pytest.mark.slow, pytest.mark.alone]

CONFIG = GatewayConfig.from_dict({"encoder": {"load": False}, "ejection": {"base_s": 0.5, "probe_interval_s": 0.2}})


@pytest.fixture(scope="module")
def root(tmp_path_factory, msmarco):
    root = tmp_path_factory.mktemp("root")
    build_collection(root, msmarco.documents, msmarco.vectors, msmarco.version, BuildConfig("rayc", 2),
                     show_progress=False)
    return root


@pytest.fixture(scope="module")
def ray_cluster(root):
    # read-only replicas: these tests only query, and an HTTP cluster of the same collection runs
    # beside it (two writers of one data dir would be refused: each replica locks its own)
    cluster = RayShardCluster(root, "rayc", replicas=2, ray_init={"num_cpus": 2}, writable=False).start()
    yield cluster
    cluster.stop()


def ranked(response: dict) -> list[tuple[str, float]]:
    return [(h["doc_id"], h["score"]) for h in response["hits"]]


def test_same_answers_as_the_http_backend(root, ray_cluster, msmarco, tmp_path):
    vectors = [v.tolist() for v in msmarco.query_vectors[:40]]
    # weighted hybrids (the vector given, the text for BM25): fused on the shards, over either transport
    hybrids = [{"vector": v, "text": msmarco.dataset.queries[q], "k": 10, "mode": "hybrid"}
               for v, q in zip(vectors[:10], msmarco.query_ids, strict=False)]
    with LocalCluster(root, "rayc", replicas=2, gateway=CONFIG, workdir=tmp_path / "work") as http_cluster:
        with httpx.Client(base_url=http_cluster.gateway_url, timeout=30) as client:
            over_http = [client.post("/v1/query", json={"vector": v, "k": 10}).json() for v in vectors]
            hybrid_http = [client.post("/v1/query", json=body).json() for body in hybrids]
            tuned_http = client.post("/v1/collections/rayc/tune", json={"sample": 40}).json()
    setup = GatewaySetup(CONFIG, ray_cluster.replica_names, shard_client=ray_cluster.client())
    with TestClient(create_app(setup)) as client:
        over_ray = [client.post("/v1/query", json={"vector": v, "k": 10}) for v in vectors]
        assert all(r.status_code == 200 for r in over_ray)
        over_ray = [r.json() for r in over_ray]
        hybrid_ray = [client.post("/v1/query", json=body).json() for body in hybrids]
        cluster_view = client.get("/v1/cluster").json()
        tuned_ray = client.post("/v1/collections/rayc/tune", json={"sample": 40}).json()  # the tuning calls, over Ray
    assert tuned_ray["queries"] == tuned_http["queries"] == 40
    assert tuned_ray["applied"] is tuned_http["applied"] is False
    assert tuned_ray["report"]["factory"] == "Flat" and "exact index" in tuned_ray["reason"]
    for a, b in zip(over_http, over_ray):
        assert [d for d, _ in ranked(a)] == [d for d, _ in ranked(b)]
        assert np.allclose([s for _, s in ranked(a)], [s for _, s in ranked(b)], atol=1e-6)
        assert a["version"] == b["version"] and not b["partial"]
    for a, b in zip(hybrid_http, hybrid_ray, strict=True):
        assert [(h["doc_id"], h["legs"]) for h in a["hits"]] == [(h["doc_id"], h["legs"]) for h in b["hits"]]
        assert len(a["hits"]) == 10 and b["diagnostics"]["fusion"].startswith("weighted")
    replicas = [r for shard in cluster_view["shards"] for r in shard["replicas"]]
    assert len(replicas) == 4 and all(r["url"].startswith("ray://") and r["healthy"] for r in replicas)


@pytest.fixture()
def doomed_cluster(root, ray_cluster):
    """Replica actors of their own (the module's Ray, another namespace): killing one leaves the
    module's cluster whole for the other tests."""
    cluster = RayShardCluster(root, "rayc", replicas=2, namespace="kill-test", writable=False).start()
    yield cluster
    cluster.stop()


def test_killing_a_replica_actor_fails_no_query(doomed_cluster, msmarco):
    vectors = [v.tolist() for v in msmarco.query_vectors]
    ray_cluster = doomed_cluster

    async def scenario() -> tuple[list, int]:
        gateway = await GatewaySetup(CONFIG, ray_cluster.replica_names, shard_client=ray_cluster.client()).build()
        results: list = []
        stop = asyncio.Event()

        async def stream(offset: int) -> None:
            i = offset
            while not stop.is_set():
                try:
                    response = await gateway.queries.query(QueryRequest(vector=vectors[i % len(vectors)], k=10,
                                                                timeout_ms=5000))
                    results.append(("ok", response["partial"]))
                except Exception as exc:  # noqa: BLE001 - counted as a failure
                    results.append(("error", repr(exc)))
                i += 3

        streams = [asyncio.create_task(stream(n)) for n in range(3)]
        await asyncio.sleep(1.5)
        before = len(results)
        ray_cluster.kill(0, 1)  # no restart: the replica is gone for good
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*streams)
        await gateway.close()
        return results, before

    results, before = asyncio.run(scenario())
    assert before > 10 and len(results) > before + 10
    failures = [r for r in results if r[0] == "error" or r[1]]
    assert not failures, failures[:3]


def test_clean_shutdown(root, ray_cluster):
    import ray

    # The module's cluster started Ray; a second cluster object reuses it and stops only its actors.
    cluster = RayShardCluster(root, "rayc", replicas=1, namespace="shutdown-test", writable=False).start()
    names = [n for group in cluster.replica_names for n in group]
    cluster.stop()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [n for n in names if _exists(ray, n[len("ray://"):], "shutdown-test")]
        if not alive:
            break
        time.sleep(0.2)
    assert not alive
    assert ray.is_initialized()  # not ours to shut down


def post_until_ok(client, path: str, body: dict, timeout_s: float = 60.0) -> None:
    """POST until 200 (replicas still electing a primary answer 503 meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while (reply := client.post(path, json=body)).status_code != 200:
        assert time.monotonic() < deadline, reply.text
        time.sleep(0.5)


def _exists(ray, name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
        return True
    except ValueError:
        return False


def test_writes_replicate_between_actors_and_survive_the_primary_actor(root, ray_cluster, msmarco):
    """Replica actors with data dirs elect a primary per shard through the collection's local
    coordinator; a write is acknowledged once both actors of its shard have it, and when the
    primary actor is killed the other takes over and writes go on."""
    import ray

    build_collection(root, msmarco.documents[:100], msmarco.vectors[:100], msmarco.version, BuildConfig("rayw", 1),
                     show_progress=False)
    cluster = RayShardCluster(root, "rayw", replicas=2, namespace="writes-test", lease_s=2.0).start()
    vector = (msmarco.vectors[0] + msmarco.vectors[1]) / np.linalg.norm(msmarco.vectors[0] + msmarco.vectors[1])
    try:
        setup = GatewaySetup(CONFIG, cluster.replica_names, shard_client=cluster.client())
        with TestClient(create_app(setup)) as client:
            # the actors elect a primary and bring the other in
            post_until_ok(client, "/v1/documents",
                          {"documents": [{"id": "ray-1", "vector": vector.tolist()}], "write_ack": "all"})
            infos = [ray.get(actor.info.remote()) for actor in cluster.actors[0]]
            assert sorted(i.role.is_primary for i in infos) == [False, True]
            assert all(i.versions[0].applied_seq == infos[0].versions[0].applied_seq for i in infos)
            primary = next(n for n, i in enumerate(infos) if i.role.is_primary)
            cluster.kill(0, primary)  # for good: the other actor takes over after the lease
            reply = client.post("/v1/documents", json={"documents": [{"id": "ray-2", "vector": vector.tolist()}],
                                                       "write_ack": "one"})
            assert reply.status_code == 200, reply.text
            assert client.get("/v1/documents/ray-1").status_code == 200
            assert client.get("/v1/documents/ray-2").status_code == 200
            # a listing through the Ray transport's scan, a document without a vector among the others
            bare_doc = {"id": "ray-3", "text": "words", "no_vector": True}
            bare = client.post("/v1/documents", json={"documents": [bare_doc], "write_ack": "one"})
            assert bare.status_code == 200, bare.text
            ids = ["ray-1", "ray-2", "ray-3"]
            page = client.post("/v1/documents/scroll", json={"filter": {"must": [{"has_id": ids}]},
                                                             "with_vectors": True}).json()
            assert [d["id"] for d in page["documents"]] == ids and page["count"] == 3
            assert "vector" in page["documents"][0] and "vector" not in page["documents"][2]
    finally:
        cluster.stop()


def test_shardrag_serve_backend_ray_cli_with_a_created_collection_on_a_node_actor(root, msmarco):
    import json
    import os
    import signal
    import subprocess
    import sys

    # a collection of its own: "rayc" was served with 2 replicas above, and whichever was its last
    # primary holds the acknowledged writes (a 1-replica start without it is refused)
    build_collection(root, msmarco.documents[:300], msmarco.vectors[:300], msmarco.version, BuildConfig("raycli", 2),
                     show_progress=False)
    process = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--backend", "ray", "--collection", "raycli",
                                "--root", str(root), "--replicas", "1", "--port", "0", "--no-encoder", "--open"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise AssertionError(process.stderr.read()[-2000:])
            if line.startswith("SHARDRAG_READY "):
                url = json.loads(line.split(" ", 1)[1])["url"]
        assert url, "the Ray-backed gateway never became ready"
        response = httpx.post(f"{url}/v1/query", json={"vector": msmarco.query_vectors[0].tolist(), "k": 5}, timeout=30)
        assert response.status_code == 200 and len(response.json()["hits"]) == 5
        written = httpx.post(f"{url}/v1/documents", json={"documents": [
            {"id": "cli-ray", "vector": msmarco.vectors[3].tolist()}]}, timeout=60)
        assert written.status_code == 200, written.text  # the actors take writes too
        assert httpx.get(f"{url}/v1/documents/cli-ray", timeout=30).status_code == 200

        # A collection created at run time lives on the node actor (--nodes 1, the default), its
        # replica reached at ray://<node actor>/c/notes/0 through the same client and peers.
        created = httpx.put(f"{url}/v1/collections/notes", json={"dim": 4}, timeout=60)
        assert created.status_code == 201, created.text
        uid = created.json()["uid"]
        assert created.json()["placement"] == [["node-0"]]
        side = httpx.post(f"{url}/v1/collections/notes/documents", json={"documents": [
            {"id": "a", "vector": [1, 0, 0, 0]}, {"id": "b", "vector": [0, 1, 0, 0]}]}, timeout=60)
        assert side.status_code == 200, side.text
        hits = httpx.post(f"{url}/v1/collections/notes/query", json={"vector": [0, 1, 0, 0], "k": 1}, timeout=30)
        assert hits.status_code == 200 and hits.json()["hits"][0]["doc_id"] == "b", hits.text
        files = root / "raycli" / "nodes" / "node-0" / "collections" / uid
        assert files.is_dir()
        assert httpx.delete(f"{url}/v1/collections/notes", timeout=60).status_code == 200
        deadline = time.monotonic() + 30
        while files.exists():  # the node actor's reconcile removes a dropped collection's files
            assert time.monotonic() < deadline, "the dropped collection's files stayed"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0



def test_node_actors_host_a_created_collection_whose_replicas_replicate_through_ray(root, ray_cluster):
    """Two node actors host a created collection's two replicas: writes acknowledged by both
    (the primary's peer calls reach the other node's replica through Ray), and a node actor that
    Ray restarts opens its replica again from its data dir and catches up."""
    import ray

    docs, vectors, version = random_corpus(30, 8)
    build_collection(root, docs, vectors, version, BuildConfig("rayn", 1), show_progress=False)
    cluster = RayShardCluster(root, "rayn", replicas=1, namespace="node-test", writable=False, nodes=2,
                              lease_s=2.0).start()
    config = GatewayConfig.from_dict({"encoder": {"load": False},
                                      "cluster": {"coordinator": cluster.state_coordinator()}})

    incarnation: list[str] = []  # the collection's uid: a replica is reached as "<name>@<uid>"

    def infos() -> list:
        return [ray.get(node.call.remote(f"pairs@{incarnation[0]}", 0, "info"), timeout=30)
                for node in cluster.node_actors]

    try:
        setup = GatewaySetup(config, cluster.replica_names, shard_client=cluster.client())
        with TestClient(create_app(setup)) as client:
            created = client.put("/v1/collections/pairs", json={"dim": 4, "replicas": 2})
            assert created.status_code == 201, created.text
            assert sorted(created.json()["placement"][0]) == ["node-0", "node-1"]
            incarnation.append(created.json()["uid"])
            # the two replicas elect a primary and bring the other in
            post_until_ok(client, "/v1/collections/pairs/documents",
                          {"documents": [{"id": "a", "vector": [1, 0, 0, 0]}], "write_ack": "all"})
            held = infos()
            assert sorted(i.role.is_primary for i in held) == [False, True]
            assert held[0].versions[0].applied_seq == held[1].versions[0].applied_seq >= 1
            primary = next(n for n, i in enumerate(held) if i.role.is_primary)
            ray.kill(cluster.node_actors[primary], no_restart=False)  # Ray restarts it
            # the other replica takes over after the lease; writes go on
            post_until_ok(client, "/v1/collections/pairs/documents",
                          {"documents": [{"id": "b", "vector": [0, 1, 0, 0]}], "write_ack": "one"})
            hits = client.post("/v1/collections/pairs/query", json={"vector": [0, 1, 0, 0], "k": 1}).json()["hits"]
            assert hits[0]["doc_id"] == "b"
            deadline = time.monotonic() + 60
            while True:  # the restarted node hosts its replica again and catches up from the primary
                try:
                    held = infos()
                    if held[0].versions[0].applied_seq == held[1].versions[0].applied_seq:
                        break
                except Exception:  # noqa: BLE001 - the restarted actor is still opening its replica
                    pass
                assert time.monotonic() < deadline, "the restarted node actor never caught up"
                time.sleep(0.5)
    finally:
        cluster.stop()
