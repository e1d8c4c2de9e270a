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
