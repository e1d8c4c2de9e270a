"""``POST /v1/collections/{name}/tune`` on a real local cluster (issue 35: tune under
/v1/collections/{name}/…): an HNSW collection of clustered vectors on two nodes, 2 shards × 2
replicas, its graphs linked with the ef_construction it was created with (one that does not
apply is a 422 naming it). Before its first compaction there is nothing in the bases to measure
(422 naming why); compacted, the tune measures the replicas, picks an ef_search whose recall meets the target,
every replica serves with it, queries without a knob get that recall, and a node killed and
restarted keeps it. A Flat collection has nothing to tune; a dry run changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.client import ShardragClient
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.conftest import random_corpus

pytestmark = pytest.mark.slow

CONFIG = GatewayConfig.from_dict({"encoder": {"load": False}})
DIM, DOCS, K = 24, 3000, 10


def clustered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((30, DIM)).astype(np.float32) * 3
    vectors = centres[rng.integers(0, 30, n)] + rng.standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def replica_defaults(http: httpx.Client, name: str) -> dict[str, object]:
    shown = http.get(f"/v1/collections/{name}").json()
    found = {}
    for shard in shown["shard_replicas"]:
        for url in shard["replicas"]:
            info = httpx.get(f"{url}/v1/info", timeout=10).json()
            found[url] = next(v.get("search_defaults") for v in info["versions"] if v["id"] == shown["active_version"])
    return found


def test_a_created_collection_is_tuned_on_its_running_replicas(tmp_path):
    root = tmp_path / "root"
    docs, vectors, version = random_corpus(30, 8)
    build_collection(root, docs, vectors, version, BuildConfig("base", 1), show_progress=False)
    data = clustered(DOCS, 1)
    with LocalCluster(root, "base", replicas=1, gateway=CONFIG, nodes=2, workdir=tmp_path / "work") as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=300) as http:
        for factory, value, why in (("Flat", 64, "applies to HNSW"), ("HNSW8", 2, "greater than or equal to 4")):
            refused = http.put("/v1/collections/bad", json={"dim": DIM, "factory": factory, "ef_construction": value})
            assert refused.status_code == 422 and refused.json()["error"]["field"] == "ef_construction", refused.text
            assert why in refused.json()["error"]["message"]
        for name, factory in (("hnsw", "HNSW8"), ("flat", "Flat")):
            created = http.put(f"/v1/collections/{name}", json={
                "dim": DIM, "shards": 2, "replicas": 2, "factory": factory,
                **({"ef_construction": 64} if factory != "Flat" else {})})
            assert created.status_code == 201, created.text
            for start in range(0, DOCS, 500):
                reply = http.post(f"/v1/collections/{name}/documents", json={"documents": [
                    {"id": f"d-{i}", "vector": data[i].tolist()} for i in range(start, min(start + 500, DOCS))]})
                assert reply.status_code == 200, reply.text

        early = http.post("/v1/collections/hnsw/tune", json={})
        assert early.status_code == 422 and early.json()["error"]["field"] == "sample", early.text
        assert "compaction" in early.json()["error"]["message"]

        for name in ("hnsw", "flat"):  # every replica folds its writes into a new HNSW base
            for shard in http.get(f"/v1/collections/{name}").json()["shard_replicas"]:
                for url in shard["replicas"]:
                    assert httpx.post(f"{url}/admin/compact", timeout=120).status_code == 200
        hnsw = http.get("/v1/collections/hnsw").json()
        assert hnsw["ef_construction"] == 64
        for shard in hnsw["shard_replicas"]:  # the compacted graphs were linked as the collection says
            for url in shard["replicas"]:
                versions = httpx.get(f"{url}/v1/info", timeout=10).json()["versions"]
                assert [v.get("ef_construction") for v in versions if v["id"] == hnsw["active_version"]] == [64]

        flat = http.post("/v1/collections/flat/tune", json={})
        assert flat.status_code == 200 and flat.json()["applied"] is False, flat.text
        assert "exact index" in flat.json()["reason"]

        dry = http.post("/v1/collections/hnsw/tune", json={"recall": 0.97, "dry_run": True})
        assert dry.status_code == 200 and dry.json()["applied"] is False, dry.text
        with ShardragClient(cluster.gateway_url, timeout_s=300) as client:  # the typed client, a dry run too
            assert client.collection("hnsw").tune(recall=0.9, sample=60, dry_run=True)["reason"] == "dry run"
        by_cli = subprocess.run([sys.executable, "-m", "serving", "tune", "--collection", "hnsw", "--live", "--dry-run",
                                 "--sample", "60", "--url", cluster.gateway_url], capture_output=True, text=True,
                                timeout=300)
        assert by_cli.returncode == 0 and "ef_search=" in by_cli.stdout and "dry run" in by_cli.stdout, by_cli
        assert set(replica_defaults(http, "hnsw").values()) == {None}

        tuned = http.post("/v1/collections/hnsw/tune", json={"recall": 0.97, "sample": 200})
        assert tuned.status_code == 200, tuned.text
        body = tuned.json()
        assert body["applied"] is True and body["report"]["knob"] == "ef_search", body
        ef = body["search_defaults"]["ef_search"]
        assert body["report"]["chosen"]["recall_low"] >= 0.97
        assert set(body["replicas"].values()) == {"applied"} and len(body["replicas"]) == 4
        assert all(d == {"ef_search": ef} for d in replica_defaults(http, "hnsw").values())

        # queries that set no knob now run at the chosen value (the same hits as naming it), with
        # the recall the tune measured, against exact answers
        rng = np.random.default_rng(7)
        recalls = []
        for i in rng.choice(DOCS, 40, replace=False):
            query = data[i] + 0.05 * rng.standard_normal(DIM).astype(np.float32)
            truth = {f"d-{j}" for j in np.argsort(-(data @ query))[:K]}
            plain = http.post("/v1/collections/hnsw/query", json={"vector": query.tolist(), "k": K}).json()["hits"]
            named = http.post("/v1/collections/hnsw/query", json={"vector": query.tolist(), "k": K,
                                                                   "ef_search": ef}).json()["hits"]
            assert [h["doc_id"] for h in plain] == [h["doc_id"] for h in named]
            recalls.append(len(truth & {h["doc_id"] for h in plain}) / K)
        assert float(np.mean(recalls)) >= 0.9, recalls

        # a node killed and restarted by the launcher keeps the tuned value (its data dir holds it)
        victim = cluster.nodes[0]
        pid = victim.process.pid
        os.kill(pid, signal.SIGKILL)
        deadline, seen = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            try:
                seen = replica_defaults(http, "hnsw")
                if victim.process.pid != pid and len(seen) == 4 and all(d == {"ef_search": ef} for d in seen.values()):
                    break
            except (httpx.HTTPError, KeyError, StopIteration, ValueError):
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"after the node's restart the replicas hold {seen}, not ef_search={ef}")
