"""The launched collection hosted by nodes instead of one process per replica (``layout="nodes"``):
2 shards × 2 replicas on 3 real node processes, placed (i + r) mod 3, no shard processes. Queries
and writes go through the gateway to replicas at ``<node>/c/<name>/<shard>``; a collection created
at run time lands on the same nodes; the node holding a primary killed -9 loses no acknowledged
write (a replica on another node takes over, the node comes back and catches up); the writes
survive a restart in the nodes layout and a move back to one process per replica."""

from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.placement import node_for
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.conftest import random_corpus
from tests.helpers.roles import primary_index, wait_all_in_sync

pytestmark = pytest.mark.slow

CONFIG = GatewayConfig.from_dict({"encoder": {"load": False}})
DIM = 16


def nearest(url: str, vector: np.ndarray, seq: dict | None = None, path: str = "/v1/query") -> str:
    body: dict = {"vector": vector.tolist(), "k": 1}
    if seq:
        body.update(consistency="session", min_seq=seq)
    reply = httpx.post(url + path, json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["hits"][0]["doc_id"]


def write(url: str, doc_id: str, vector: np.ndarray) -> dict:
    reply = httpx.post(f"{url}/v1/documents", json={"documents": [{"id": doc_id, "vector": vector.tolist()}]},
                       timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["seq"]


def test_nodes_host_the_launched_collection_through_a_node_kill_and_restarts(tmp_path):
    root = tmp_path / "root"
    docs, vectors, version = random_corpus(400, DIM)
    build_collection(root, docs, vectors, version, BuildConfig("base", 2), show_progress=False)
    fresh = np.random.default_rng(7).standard_normal((40, DIM)).astype(np.float32)
    fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
    with LocalCluster(root, "base", replicas=2, nodes=3, layout="nodes", gateway=CONFIG,
                      workdir=tmp_path / "work1") as cluster:
        url = cluster.gateway_url
        assert cluster.shards == [] and len(cluster.nodes) == 3  # no process per replica
        node_urls = [str(node.url) for node in cluster.nodes]
        for shard in range(2):
            for replica in range(2):
                expected = f"{node_urls[node_for(shard, replica, 3)]}/c/base/{shard}"
                assert cluster.shard_urls[shard][replica] == expected
        hosted = [httpx.get(f"{u}/v1/node", timeout=10).json()["replicas"] for u in node_urls]
        assert sorted((r["collection"], r["shard"]) for h in hosted for r in h) == \
            [("base", 0), ("base", 0), ("base", 1), ("base", 1)]
        assert nearest(url, vectors[3]) == docs[3].doc_id and nearest(url, vectors[399]) == docs[399].doc_id

        for i in range(20):
            seq = write(url, f"fresh-{i}", fresh[i])
        assert nearest(url, fresh[19], seq) == "fresh-19"

        created = httpx.put(f"{url}/v1/collections/side", json={"dim": 4, "replicas": 2}, timeout=60)
        assert created.status_code == 201, created.text
        side = httpx.post(f"{url}/v1/collections/side/documents",
                          json={"documents": [{"id": "s", "vector": [1, 0, 0, 0]}]}, timeout=30)
        assert side.status_code == 200, side.text
        assert nearest(url, np.array([1, 0, 0, 0], np.float32), path="/v1/collections/side/query") == "s"

        # Kill -9 the node that holds shard 0's primary: its other replica, on another node, takes over.
        urls = cluster.shard_urls[0]
        victim = node_for(0, primary_index(urls), 3)
        os.kill(cluster.nodes[victim].process.pid, signal.SIGKILL)
        written_to: set[str] = set()
        for i in range(20, 40):
            written_to |= set(write(url, f"fresh-{i}", fresh[i]))
        assert "0" in written_to  # shard 0 took writes without the node of its old primary
        for i in (0, 19, 20, 39):
            assert nearest(url, fresh[i]) == f"fresh-{i}"
        deadline = time.monotonic() + 60
        while cluster.nodes[victim].restarts == 0 or cluster.nodes[victim].ready is None:
            assert time.monotonic() < deadline, "the supervisor did not restart the killed node"
            time.sleep(0.2)
        for shard_urls in cluster.shard_urls:
            wait_all_in_sync(shard_urls)

    with LocalCluster(root, "base", replicas=2, nodes=3, layout="nodes", gateway=CONFIG,
                      workdir=tmp_path / "work2") as cluster:
        for i in (0, 19, 20, 39):
            assert nearest(cluster.gateway_url, fresh[i]) == f"fresh-{i}"
        assert nearest(cluster.gateway_url, np.array([1, 0, 0, 0], np.float32),
                       path="/v1/collections/side/query") == "s"
    # Back to one process per replica: the same data folders, so the same writes.
    with LocalCluster(root, "base", replicas=2, nodes=0, gateway=CONFIG, workdir=tmp_path / "work3") as cluster:
        assert len(cluster.shards) == 2
        for i in (0, 39):
            assert nearest(cluster.gateway_url, fresh[i]) == f"fresh-{i}"


def test_the_nodes_layout_refuses_fewer_nodes_than_replicas_and_a_bad_layout(tmp_path):
    root = tmp_path / "root"
    docs, vectors, version = random_corpus(20, DIM)
    build_collection(root, docs, vectors, version, BuildConfig("base", 1), show_progress=False)
    with pytest.raises(Exception, match="layout must be processes or nodes"):
        LocalCluster(root, "base", replicas=1, layout="pods", gateway=CONFIG, workdir=tmp_path / "w")
    cluster = LocalCluster(root, "base", replicas=3, nodes=1, layout="nodes", gateway=CONFIG, workdir=tmp_path / "w")
    assert cluster.node_count == 3  # raised to the replicas: a shard's replicas need distinct nodes
