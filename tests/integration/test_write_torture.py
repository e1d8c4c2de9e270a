"""Torture: a writer streams 5,000 upserts and 1,000 deletes (write_ack=majority) into 2 shards ×
3 replica processes while one replica is kill -9'd every 2 s (the supervisor restarts it) and two
readers query all along. Afterwards, once every replica has caught up, each holds exactly the
model of acknowledged writes: same ids, same vectors bit for bit, same metadata (compared through
the replicas' digests), nothing acknowledged lost, nothing deleted resurrected, and the readers saw
no error."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.records import document_fingerprint
from retrieval.routing import hash_shard
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.conftest import REPORT

# alone (tests/sharing.py): a kill -9 every 2 s in real time
pytestmark = [pytest.mark.slow, pytest.mark.alone]
BASE_DOCS = 400
UPSERTS, DELETES, BATCH = 5000, 1000, 20


def model_digest(model: dict, shard: int) -> dict:
    digest = hashlib.sha256()
    rows = sorted((doc_id, row) for doc_id, row in model.items() if hash_shard(doc_id, 2) == shard)
    for doc_id, (vector, title, text, metadata) in rows:
        digest.update(document_fingerprint(doc_id, vector, title, text, metadata))
    return {"count": len(rows), "sha256": digest.hexdigest()}


retries = [0]


def send_until_acknowledged(client: httpx.Client, path: str, body: dict) -> dict:
    """A batch is retried (same idempotency key) until a majority of every touched shard has it."""
    deadline = time.monotonic() + 120
    while True:
        response = client.post(path, json=body)
        if response.status_code == 200:
            return response.json()
        retries[0] += 1
        assert response.status_code in (503, 504), response.text  # a shard short of a majority: retry
        assert time.monotonic() < deadline, f"no majority for 120 s: {response.text}"
        time.sleep(0.2)


def test_acknowledged_writes_survive_kill_9_every_2_seconds(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents[:BASE_DOCS], msmarco.vectors[:BASE_DOCS], msmarco.version,
                     BuildConfig("torture", 2), show_progress=False)
    model = {d.doc_id: (msmarco.vectors[i], d.title, d.text, dict(d.metadata))
             for i, d in enumerate(msmarco.documents[:BASE_DOCS])}
    config = GatewayConfig.from_dict({"encoder": {"load": False}, "rollout": {"poll_interval_s": 0.3}})
    rng = np.random.default_rng(2026)
    with LocalCluster(root, "torture", replicas=3, gateway=config, workdir=tmp_path / "work") as cluster:
        stop = threading.Event()
        read_errors: list[str] = []
        reads = [0]
        kills = [0]
        retries[0] = 0

        def read() -> None:
            with httpx.Client(base_url=cluster.gateway_url, timeout=30) as client:
                i = 0
                while not stop.is_set():
                    vector = msmarco.query_vectors[i % len(msmarco.query_vectors)].tolist()
                    response = client.post("/v1/query", json={"vector": vector, "k": 10})
                    if response.status_code != 200 or response.json()["partial"]:
                        read_errors.append(response.text[:300])
                    reads[0] += 1
                    i += 1

        def kill() -> None:
            chooser = random.Random(7)
            while not stop.wait(2.0):
                replica = chooser.choice([r for row in cluster.shards for r in row])
                if replica.process is not None and replica.process.poll() is None:
                    os.kill(replica.process.pid, signal.SIGKILL)
                    kills[0] += 1

        threads = [threading.Thread(target=read) for _ in range(2)] + [threading.Thread(target=kill)]
        for thread in threads:
            thread.start()
        try:
            with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
                upserted = 0
                deleted = 0
                batch_no = 0
                # (and until 3 kills landed: on a fast machine the quotas alone can take under 6 s)
                while upserted < UPSERTS or deleted < DELETES or kills[0] < 3:
                    batch_no += 1
                    if deleted < DELETES and (batch_no % 6 == 0 or upserted >= UPSERTS):
                        ids = rng.choice(sorted(model), size=BATCH, replace=False).tolist()
                        send_until_acknowledged(client, "/v1/documents/delete",
                                                {"ids": ids, "idempotency_key": f"d{batch_no}"})
                        for doc_id in ids:
                            del model[doc_id]
                        deleted += len(ids)
                        continue
                    documents = []
                    for j in range(BATCH):
                        # a third of the upserts replace a live document, the rest are new
                        replace = j % 3 == 0 and model
                        doc_id = (sorted(model)[int(rng.integers(len(model)))] if replace
                                  else f"t-{batch_no}-{j}")
                        vector = rng.standard_normal(384).astype(np.float32)
                        vector /= np.linalg.norm(vector)
                        metadata = {"batch": batch_no, "tag": ["a", "b"][j % 2]}
                        documents.append({"id": doc_id, "title": f"title {batch_no}.{j}", "text": "",
                                          "vector": vector.tolist(), "metadata": metadata})
                    unique = {d["id"]: d for d in documents}
                    documents = list(unique.values())
                    send_until_acknowledged(client, "/v1/documents",
                                            {"documents": [{k: v for k, v in d.items() if k != "text"}
                                                           for d in documents],
                                             "idempotency_key": f"u{batch_no}"})
                    for d in documents:
                        model[d["id"]] = (np.asarray(d["vector"], dtype=np.float32), d["title"], "", d["metadata"])
                    upserted += len(documents)
        finally:
            stop.set()
            for thread in threads:
                thread.join()

        assert kills[0] >= 3 and reads[0] > 100
        assert read_errors == [], read_errors[:3]
        # every replica up and caught up (the gateway's repair loop), then exactly the model
        expected = {shard: model_digest(model, shard) for shard in (0, 1)}
        converge_started = time.monotonic()
        deadline = time.monotonic() + 120
        while True:
            digests = {}
            for shard, row in enumerate(cluster.shards):
                for number, replica in enumerate(row):
                    try:
                        digests[(shard, number)] = httpx.get(f"{replica.ready['url']}/admin/digest",
                                                             timeout=30).json()
                    except (httpx.HTTPError, TypeError, KeyError):
                        digests[(shard, number)] = None
            wrong = {key: d for key, d in digests.items()
                     if d is None or (d["count"], d["sha256"]) != (expected[key[0]]["count"],
                                                                   expected[key[0]]["sha256"])}
            if not wrong:
                REPORT.append(f"write torture 2x3: {UPSERTS} upserts + {DELETES} deletes (majority), {kills[0]} "
                              f"kill -9s, {retries[0]} batches retried; {reads[0]} reads, 0 errors; 6 replicas = model "
                              f"({len(model)} docs) after {time.monotonic() - converge_started:.1f} s of catch-up")
                break
            assert time.monotonic() < deadline, f"replicas never converged on the model: {wrong} vs {expected}"
            time.sleep(1.0)
