"""A real rollout: 2 shards × 2 replica processes + a gateway process with real encoders.

V1 is all-MiniLM-L6-v2; V2 the same model with its weights perturbed (a real, different
embedding version, re-embedded for V2); V3 a broken build (a third checkpoint, documents
indexed with random vectors). Under steady query load: stage → activate → retire gives no
error and no mixed answer; the quality gate blocks V3 and passes V2; a damaged shard blocks
activation with its reason; a gateway killed during activation comes back consistent."""

import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import shard_dir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache
from retrieval.encoders import SentenceTransformerEncoder, default_model_dir, encode_documents
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from serving.local.state import wait_for_encoder
from tests.helpers.checkpoints import perturbed_checkpoint

pytestmark = pytest.mark.slow
DOCS = 600


@pytest.fixture(scope="module")
def versions(tmp_path_factory, msmarco, cache_dir):
    root = tmp_path_factory.mktemp("root")
    models = tmp_path_factory.mktemp("models")
    documents = msmarco.documents[:DOCS]
    build_collection(root, documents, msmarco.vectors[:DOCS], msmarco.version, BuildConfig("docs", 2),
                     show_progress=False)
    good_dir = perturbed_checkpoint(default_model_dir(), models / "minilm-tuned", seed=1, scale=0.02)
    good = CachingEncoder(SentenceTransformerEncoder(good_dir, device="cpu"), EmbeddingCache(cache_dir))
    build_collection(root, documents, encode_documents(good, documents, show_progress=False), good.version,
                     BuildConfig("docs", 2), show_progress=False)
    bad_dir = perturbed_checkpoint(default_model_dir(), models / "minilm-broken", seed=2, scale=0.02)
    bad_version = SentenceTransformerEncoder(bad_dir, device="cpu").version
    noise = np.random.default_rng(0).standard_normal((DOCS, 384)).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    build_collection(root, documents, noise, bad_version, BuildConfig("docs", 2), show_progress=False)
    return {"root": root, "v1": msmarco.version.id, "v2": good.version.id, "v2_model": str(good_dir),
            "v3": bad_version.id, "v3_model": str(bad_dir)}


@pytest.fixture()
def cluster(tmp_path_factory, versions):
    """A fresh cluster (and rollout state) per test: each starts on V1 with nothing staged, whatever
    ran before it."""
    work = tmp_path_factory.mktemp("work")
    config = GatewayConfig.from_dict({
        "rollout": {"state_path": str(work / "rollout.json"), "poll_interval_s": 0.3, "drain_s": 1.0},
        "gate": {"min_overlap": 0.5, "sample": 30,
                 # no pauses between the gate's query pairs: these tests are about the protocol
                 # (the pacing is tested in tests/unit/serving/test_gate.py), and CI time counts
                 "busy_share": 1.0}})
    with LocalCluster(versions["root"], "docs", version=versions["v1"], replicas=2, gateway=config,
                      workdir=work) as running:
        yield running


@pytest.fixture(scope="module")
def queries(msmarco):
    return [msmarco.dataset.queries[q] for q in msmarco.query_ids]


def admin(cluster, command, **body):
    return httpx.post(f"{cluster.gateway_url}/admin/rollout/{command}", json=body, timeout=120)


def status(cluster):
    return httpx.get(f"{cluster.gateway_url}/admin/rollout", timeout=30).json()


def wait_ready(cluster, version, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = status(cluster)
        replicas = [row for rows in current["replicas"].get(version, {}).values() for row in rows]
        encoder = current["encoders"].get(version, {}).get("state")
        if replicas and all(r["state"] == "ready" for r in replicas) and encoder == "ready":
            return current
        time.sleep(0.3)
    raise AssertionError(f"{version} not ready: {status(cluster)}")


def test_replica_refuses_a_version_it_does_not_hold(cluster, versions, msmarco):
    url = cluster.shard_urls[0][0]
    body = msmarco.query_vectors[:1].astype("<f4").tobytes()
    response = httpx.post(f"{url}/v1/search?k=3&version={versions['v3']}", content=body, timeout=10)
    assert response.status_code == 409
    assert versions["v1"] in response.json()["error"]["message"]  # it names what it has


def test_quality_gate_blocks_a_bad_build_and_a_damaged_shard_blocks_activation(cluster, versions, queries):
    v3 = versions["v3"]
    assert admin(cluster, "stage", version=v3, model=versions["v3_model"]).status_code == 200
    wait_ready(cluster, v3)
    refused = admin(cluster, "activate", version=v3, queries=queries)
    error = refused.json()["error"]
    assert refused.status_code == 409 and "quality gate" in error["message"]
    assert error["gate"]["overlap_at_10"] < 0.1 and error["gate"]["queries"] == 30
    assert admin(cluster, "abort", version=v3).json()["state"]["staged"] is None
    assert status(cluster)["state"]["active"] == versions["v1"]

    path = shard_dir(versions["root"] / "docs" / v3, 1) / "docs.sqlite"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10
    path.write_bytes(bytes(data))
    admin(cluster, "stage", version=v3, model=versions["v3_model"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = status(cluster)["replicas"][v3]["1"]
        if all(row["state"] == "failed" for row in rows):
            break
        time.sleep(0.3)
    refused = admin(cluster, "activate", version=v3, force=True)
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert "shard 1: 0/2 replicas ready" in message and "docs.sqlite" in message
    admin(cluster, "abort", version=v3)


def run_load(cluster, queries, stop, results):
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
        i = 0
        while not stop.is_set():
            sent = time.monotonic()
            response = client.post("/v1/query", json={"text": queries[i % len(queries)], "k": 10})
            results.append((sent, time.monotonic(), response.status_code, response.json()))
            i += 1


@pytest.mark.alone  # tests/sharing.py: no query under its load may miss the default 5 s deadline
def test_full_rollout_under_load_never_mixes_versions(cluster, versions, queries):
    v1, v2 = versions["v1"], versions["v2"]
    results: list = []
    stop = threading.Event()
    workers = [threading.Thread(target=run_load, args=(cluster, queries, stop, results)) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1.0)
        staged = admin(cluster, "stage", version=v2, model=versions["v2_model"])
        assert staged.status_code == 200, staged.text
        wait_ready(cluster, v2)
        time.sleep(0.5)
        activated = admin(cluster, "activate", version=v2, queries=queries)
        assert activated.status_code == 200, activated.text
        activated_at = time.monotonic()
        gate = activated.json()["gate"]
        assert gate["passed"] and gate["overlap_at_10"] >= 0.5
        again = admin(cluster, "activate", version=v2, queries=queries).json()
        assert not again["changed"]  # a retried command is a no-op
        time.sleep(1.5)  # the drain period
        retired = admin(cluster, "retire", version=v1)
        assert retired.status_code == 200 and retired.json()["state"]["previous"] is None, retired.text
        time.sleep(1.0)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert len(results) > 30
    errors = [(code, body) for _, _, code, body in results if code != 200]
    assert errors == [], errors[:3]
    for _, _, _, body in results:
        assert body["version"] in (v1, v2) and not body["partial"]
        assert {hit["version"] for hit in body["hits"]} == {body["version"]}  # never mixed
    after = [body["version"] for sent, _, _, body in results if sent > activated_at]
    assert after and set(after) == {v2}
    before = [body["version"] for _, done, _, body in results if done < activated_at - 2.0]
    assert before and set(before) == {v1}


def test_a_replica_restarted_after_a_rollout_comes_back_on_the_active_version(cluster, versions):
    v2 = versions["v2"]
    assert admin(cluster, "stage", version=v2, model=versions["v2_model"]).status_code == 200
    wait_ready(cluster, v2)
    assert admin(cluster, "activate", version=v2, force=True).status_code == 200
    assert admin(cluster, "retire", version=versions["v1"], force=True).status_code == 200
    assert status(cluster)["state"]["active"] == v2 and status(cluster)["state"]["previous"] is None
    victim = cluster.shards[0][1]
    old_pid = victim.process.pid
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while victim.process.pid == old_pid or victim.ready is None:
        assert time.monotonic() < deadline, "the supervisor did not restart the replica"
        time.sleep(0.1)
    assert victim.ready["version"] == v2  # loaded V2 itself, no reconciliation needed to serve
    info = httpx.get(f"{victim.ready['url']}/v1/info", timeout=10).json()
    assert [v["id"] for v in info["versions"] if v.get("state") == "ready"] == [v2]


def test_gateway_killed_during_activation_comes_back_consistent(cluster, versions, queries):
    v1, v2 = versions["v1"], versions["v2"]
    current = status(cluster)["state"]
    if current["active"] == v2:  # after the full cycle: roll forward again from a fresh stage of V1
        target, model = v1, "default"
    else:
        target, model = v2, versions["v2_model"]
    assert admin(cluster, "stage", version=target, model=model).status_code == 200
    wait_ready(cluster, target)
    gateway = cluster.gateway
    old_pid = gateway.process.pid
    outcome = {}

    def activate():
        try:
            outcome["response"] = admin(cluster, "activate", version=target, queries=queries * 4, force=True)
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    replicas = [url for group in cluster.shard_urls for url in group]
    for url in replicas:  # slow searches down so the kill lands while the quality gate runs
        httpx.put(f"{url}/admin/faults", json={"latency": "fixed:400"}, timeout=10).raise_for_status()
    caller = threading.Thread(target=activate)
    caller.start()
    time.sleep(0.3)
    os.kill(old_pid, signal.SIGKILL)
    caller.join()
    for url in replicas:
        httpx.put(f"{url}/admin/faults", json={}, timeout=10).raise_for_status()
    assert "error" in outcome, outcome  # the activation never answered: it was cut off mid-way
    deadline = time.monotonic() + 90
    while gateway.process.pid == old_pid or gateway.ready is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    wait_for_encoder(cluster.gateway_url, time.monotonic() + 90, None, gateway.log_tail)
    state = status(cluster)["state"]
    # killed before its transition was recorded: the restarted gateway resumes "staged", not half of it
    assert (state["active"], state["staged"]) == (current["active"], target)
    for text in queries[:10]:
        body = httpx.post(f"{cluster.gateway_url}/v1/query", json={"text": text, "k": 10}, timeout=60).json()
        assert body["version"] == state["active"] and {h["version"] for h in body["hits"]} == {state["active"]}
    done = admin(cluster, "activate", version=target, force=True)  # re-issued: completes or is a no-op
    assert done.status_code == 200 and done.json()["state"]["active"] == target


def write_until_stopped(cluster, stop, acknowledged, refused):
    """Upserts of text documents, one small batch at a time; a 503 (a version loading) is retried."""
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
        n = 0
        while not stop.is_set():
            batch = [{"id": f"rollout-write-{time.monotonic_ns()}-{i}", "metadata": {"n": n + i},
                      "text": f"rollout diary entry {n + i}: the staged encoder must see this write"} for i in range(3)]
            response = client.post("/v1/documents", json={"documents": batch})
            if response.status_code == 200:
                acknowledged.extend(d["id"] for d in batch)
                n += len(batch)
            elif response.status_code == 503:
                refused.append(response.json()["error"]["message"])
                time.sleep(0.1)
            else:
                raise AssertionError(response.text)


@pytest.mark.alone  # tests/sharing.py: no query under its load may miss the default 5 s deadline
def test_writes_during_a_rollout_are_all_in_the_new_version(cluster, versions, queries):
    v1, v2 = versions["v1"], versions["v2"]
    results: list = []
    acknowledged: list[str] = []
    refused: list[str] = []
    stop = threading.Event()
    workers = [threading.Thread(target=run_load, args=(cluster, queries, stop, results)),
               threading.Thread(target=write_until_stopped, args=(cluster, stop, acknowledged, refused))]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1.0)
        assert admin(cluster, "stage", version=v2, model=versions["v2_model"]).status_code == 200
        wait_ready(cluster, v2)
        time.sleep(1.5)  # writes into V1 while V2 is staged (replayed into it before it is synced)
        during_staging = len(acknowledged)
        activated = admin(cluster, "activate", version=v2, queries=queries)
        assert activated.status_code == 200, activated.text
        time.sleep(1.0)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert during_staging > 0 and len(acknowledged) > during_staging
    assert refused == []  # never refused: V2 takes writes once synced, and the sync's fence only holds them a moment
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
        for doc_id in acknowledged:  # every acknowledged write, whenever it came, is in V2
            stored = client.get(f"/v1/documents/{doc_id}")
            assert stored.status_code == 200, (doc_id, stored.text)
            assert stored.json()["version"] == v2
    errors = [(code, body) for _, _, code, body in results if code != 200]
    assert errors == [], errors[:3]
    for _, _, _, body in results:
        assert {hit["version"] for hit in body["hits"]} <= {body["version"]}  # never mixed
    admin(cluster, "retire", version=v1, force=True)
