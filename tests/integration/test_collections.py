"""Collections created at run time through REST, on a real local cluster with two nodes: 50 of
different dimensions written and queried, half dropped, the cluster restarted — the kept half
intact (their writes replayed from the nodes' WALs), the dropped half gone from every node's disk."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.conftest import random_corpus

pytestmark = pytest.mark.slow

CONFIG = GatewayConfig.from_dict({"encoder": {"load": False}})
COLLECTIONS = 50
DOCS = 6


def documents(dim: int, seed: int) -> tuple[list[dict], np.ndarray]:
    vectors = np.random.default_rng(seed).standard_normal((DOCS, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [{"id": f"doc-{i}", "vector": v.tolist(), "metadata": {"i": i}} for i, v in enumerate(vectors)], vectors


def check_nearest(url: str, name: str, vectors: np.ndarray) -> None:
    for i in (0, DOCS - 1):
        reply = httpx.post(f"{url}/v1/collections/{name}/query", json={"vector": vectors[i].tolist(), "k": 3},
                           timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["hits"][0]["doc_id"] == f"doc-{i}", (name, reply.json())


def test_fifty_collections_survive_a_restart_and_dropped_ones_leave_no_files(tmp_path):
    root = tmp_path / "root"
    docs, vectors, version = random_corpus(60, 8)
    build_collection(root, docs, vectors, version, BuildConfig("base", 1), show_progress=False)
    kept: dict[str, np.ndarray] = {}
    dropped: dict[str, str] = {}  # name → uid
    with LocalCluster(root, "base", replicas=1, gateway=CONFIG, nodes=2, workdir=tmp_path / "work1") as cluster:
        url = cluster.gateway_url
        for number in range(COLLECTIONS):
            name, dim = f"c{number:02d}", 4 + number  # 4 … 53 dimensions
            shape = {"shards": 1 + number % 2, "replicas": 1 + (number % 3 == 0), "metric": "ip"}
            created = httpx.put(f"{url}/v1/collections/{name}", json={"dim": dim, **shape}, timeout=60)
            assert created.status_code == 201, created.text
            batch, vecs = documents(dim, number)
            written = httpx.post(f"{url}/v1/collections/{name}/documents", json={"documents": batch}, timeout=30)
            assert written.status_code == 200, written.text
            check_nearest(url, name, vecs)
            if number % 2:
                dropped[name] = created.json()["uid"]
            else:
                kept[name] = vecs
        again = httpx.put(f"{url}/v1/collections/c00", json={"dim": 4}, timeout=30)
        assert again.status_code == 409 and again.json()["error"]["field"] == "name"
        wrong_dim = httpx.post(f"{url}/v1/collections/c00/query", json={"vector": [0.1] * 5, "k": 1})
        assert wrong_dim.status_code == 422
        for name in dropped:
            assert httpx.delete(f"{url}/v1/collections/{name}", timeout=30).status_code == 200
        listed = {row["name"] for row in httpx.get(f"{url}/v1/collections").json()["collections"]}
        assert listed == {"base", *kept}
    # A whole new cluster process tree over the same root and cluster state.
    with LocalCluster(root, "base", replicas=1, gateway=CONFIG, nodes=2, workdir=tmp_path / "work2") as cluster:
        url = cluster.gateway_url
        for name, vecs in kept.items():
            shown = httpx.get(f"{url}/v1/collections/{name}", timeout=60)
            assert shown.status_code == 200 and shown.json()["documents"] == DOCS, shown.text
            check_nearest(url, name, vecs)
        for name in dropped:
            assert httpx.post(f"{url}/v1/collections/{name}/query", json={"vector": [0.0] * 4}).status_code == 404
    node_dirs = list((root / "base" / "nodes").glob("node-*/collections/*"))
    on_disk = {d.name for d in node_dirs}
    assert on_disk and not on_disk & set(dropped.values()), "a dropped collection left files on a node"
    assert len({p.name for p in (root / "base" / "nodes").glob("node-*/collections/*")}) == len(kept)


def test_the_cli_and_both_clients_manage_collections(tmp_path):
    import asyncio
    import subprocess
    import sys

    from retrieval.client import AsyncShardragClient, ShardragClient
    from retrieval.errors import NotFound

    root = tmp_path / "root"
    docs, vectors, version = random_corpus(40, 8)
    build_collection(root, docs, vectors, version, BuildConfig("base", 1), show_progress=False)
    with LocalCluster(root, "base", replicas=1, gateway=CONFIG, nodes=1, workdir=tmp_path / "work") as cluster:
        url = cluster.gateway_url

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "serving", "collections", *args, "--url", url],
                                  capture_output=True, text=True, timeout=120)

        created = cli("create", "notes", "--dim", "8", "--shards", "2", "--tenant-field", "team")
        assert created.returncode == 0 and "created notes: 8 dims, 2 shard(s)" in created.stdout, created.stderr
        refused = cli("create", "notes", "--dim", "8")
        assert refused.returncode == 2 and "already exists" in refused.stderr
        flat_breadth = cli("create", "flatter", "--dim", "8", "--ef-construction", "64")
        assert flat_breadth.returncode == 2 and "ef_construction applies to HNSW" in flat_breadth.stderr
        with ShardragClient(url) as client:
            notes = client.collection("notes")
            batch, vecs = documents(8, 7)
            notes.upsert([{**d, "metadata": {"team": "red"}} for d in batch])
            assert notes.query(vector=vecs[2].tolist(), k=1)["hits"][0]["doc_id"] == "red::doc-2"
            assert notes.get("red::doc-2")["metadata"]["team"] == "red"
            assert client.get_collection("notes")["documents"] == DOCS
        listed = cli("list")
        assert "base" in listed.stdout and "notes" in listed.stdout and "tenant field 'team'" in listed.stdout
        assert f"{DOCS} documents" in cli("show", "notes").stdout

        async def with_the_async_client() -> None:
            async with AsyncShardragClient(url) as client:
                await client.create_collection("scratch", dim=3, factory="HNSW16", ef_construction=32)
                assert (await client.get_collection("scratch"))["ef_construction"] == 32
                scratch = client.collection("scratch")
                await scratch.upsert([{"id": "a", "vector": [1.0, 0.0, 0.0]}])
                assert (await scratch.query(vector=[1.0, 0.0, 0.0], k=1))["hits"][0]["doc_id"] == "a"
                assert {c["name"] for c in await client.list_collections()} == {"base", "notes", "scratch"}
                await client.drop_collection("scratch")
                with pytest.raises(NotFound):
                    await client.get_collection("scratch")

        asyncio.run(with_the_async_client())
        dropped = cli("drop", "notes", "--yes")
        assert dropped.returncode == 0 and "dropped notes" in dropped.stdout
        assert "notes" not in cli("list").stdout


def test_a_killed_node_loses_no_acknowledged_write_of_a_created_collection(tmp_path):
    """Writes run on a created collection (1 shard × 3 replicas on three nodes, majority acks)
    while the node holding its primary is SIGKILLed: another replica takes over and writes go on,
    every acknowledged id reads back, and the killed node — restarted by the launcher — catches its
    replica up until the three hold the same documents."""
    import os
    import signal
    import threading
    import time

    root = tmp_path / "root"
    docs, vectors, version = random_corpus(20, 8)
    build_collection(root, docs, vectors, version, BuildConfig("base", 1), show_progress=False)
    with LocalCluster(root, "base", replicas=1, gateway=CONFIG, nodes=3, workdir=tmp_path / "work") as cluster:
        url = cluster.gateway_url
        created = httpx.put(f"{url}/v1/collections/acked", json={"dim": 8, "replicas": 3}, timeout=60)
        assert created.status_code == 201, created.text
        acked: list[tuple[float, str]] = []
        stop = threading.Event()

        def write() -> None:
            rng = np.random.default_rng(3)
            batch = 0
            with httpx.Client(timeout=15) as client:
                while not stop.is_set():
                    ids = [f"w{batch}-{i}" for i in range(5)]
                    body = {"documents": [{"id": i, "vector": rng.standard_normal(8).tolist()} for i in ids]}
                    batch += 1
                    try:
                        reply = client.post(f"{url}/v1/collections/acked/documents", json=body)
                    except httpx.HTTPError:
                        continue  # unknown outcome: not counted as acknowledged
                    if reply.status_code == 200:
                        acked.extend((time.monotonic(), i) for i in ids)

        def replicas() -> list[dict]:
            found = []
            for node in cluster.nodes:
                try:
                    hosted = httpx.get(f"{node.ready['url']}/v1/node", timeout=5).json()["replicas"]
                except (httpx.HTTPError, TypeError):
                    continue
                found += [{**r, "node": node} for r in hosted if r["collection"] == "acked"]
            return found

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(2)
        primary = next(r for r in replicas() if httpx.get(f"{r['url']}/v1/role", timeout=5).json()["is_primary"])
        victim = primary["node"]
        killed_at, pid = time.monotonic(), victim.process.pid
        os.kill(pid, signal.SIGKILL)
        time.sleep(10)
        stop.set()
        writer.join(timeout=30)
        after_kill = [i for at, i in acked if at > killed_at]
        assert after_kill, "no write was acknowledged after the primary's node was killed"
        with httpx.Client(timeout=10) as client:
            missing = [i for _, i in acked
                       if client.get(f"{url}/v1/collections/acked/documents/{i}").status_code != 200]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged writes are missing: {missing[:5]}"
        # the launcher restarts the node; its replica catches up with the new primary's writes
        deadline, digests = time.monotonic() + 60, set()
        while time.monotonic() < deadline:
            found = replicas()
            digests = set()
            for replica in found:
                try:
                    digests.add(httpx.get(f"{replica['url']}/admin/digest", timeout=5).json()["sha256"])
                except (httpx.HTTPError, KeyError):
                    digests.add(None)
            if len(found) == 3 and len(digests) == 1 and victim.process.pid != pid:
                break
            time.sleep(0.5)
        assert len(digests) == 1 and victim.process.pid != pid, f"replicas did not converge: {digests}"
