"""The rollout through the gateway's admin API, in process: two real FAISS versions of one
collection, replicas that hold several versions, refusals with reasons, idempotent commands."""

import pytest
from fastapi.testclient import TestClient

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.types import EmbeddingVersion
from serving.gateway.app import create_app, gateway_of
from serving.gateway.config import GatewayConfig
from serving.gateway.factory import GatewaySetup
from serving.transport.inprocess import InProcessShardClient
from tests.conftest import random_corpus

DIM = 16


def build_version(root, name, seed):
    documents, vectors, _ = random_corpus(n=300, dim=DIM, seed=seed)
    version = EmbeddingVersion(f"enc{seed}", f"{seed:02d}" * 32, DIM)
    build_collection(root, documents, vectors, version, BuildConfig("c", 2), show_progress=False)
    return version.id, vectors


@pytest.fixture
def cluster(tmp_path):
    v1, vectors1 = build_version(tmp_path, "c", 1)
    v2, vectors2 = build_version(tmp_path, "c", 2)
    directory, _ = resolve_version(tmp_path, "c", v1)
    shards = [Shard.load(shard_dir(directory, s), device="cpu") for s in range(2)]
    shard_client, replicas = InProcessShardClient.of(shards)
    config = GatewayConfig.from_dict({"encoder": {"load": False},
                                      "rollout": {"drain_s": 3600, "state_path": str(tmp_path / "rollout.json")}})
    app = create_app(GatewaySetup(config, replicas, shard_client=shard_client))
    with TestClient(app) as client:
        yield client, gateway_of(app), (v1, vectors1), (v2, vectors2), tmp_path


def wait_ready(gateway, client, version):
    for _ in range(200):
        client.get("/admin/rollout")  # refreshes what the replicas report
        if all(gateway.registry.eligible(s, version) for s in range(2)):
            return
    raise AssertionError(f"{version} never became ready")


def query(client, vector, **extra):
    return client.post("/v1/query", json={"vector": vector.tolist(), "k": 5, **extra})


def test_stage_activate_retire_with_pins_and_idempotent_repeats(cluster):
    client, gateway, (v1, vectors1), (v2, vectors2), root = cluster
    assert client.get("/admin/rollout").json()["state"]["active"] == v1
    staged = client.post("/admin/rollout/stage", json={"version": v2}).json()
    assert staged["changed"] and staged["state"]["staged"] == v2
    again = client.post("/admin/rollout/stage", json={"version": v2}).json()
    assert not again["changed"] and again["state"]["generation"] == staged["state"]["generation"]
    wait_ready(gateway, client, v2)
    # queries go to V1; a pinned query may use the staged V2; every hit carries its version
    body = query(client, vectors1[3]).json()
    assert body["version"] == v1 and {h["version"] for h in body["hits"]} == {v1}
    assert body["hits"][0]["doc_id"] == "doc-3"
    pinned = query(client, vectors2[7], version=v2).json()
    assert pinned["version"] == v2 and {h["version"] for h in pinned["hits"]} == {v2}
    assert pinned["hits"][0]["doc_id"] == "doc-7"
    # this gateway runs without encoders, so the quality gate cannot compare: activation needs force
    refused = client.post("/admin/rollout/activate", json={"version": v2, "queries": ["x"]})
    assert refused.status_code == 409 and "quality gate" in refused.json()["error"]["message"]
    activated = client.post("/admin/rollout/activate", json={"version": v2, "force": True}).json()
    assert activated["changed"] and activated["state"]["active"] == v2 and activated["state"]["previous"] == v1
    assert not client.post("/admin/rollout/activate", json={"version": v2, "force": True}).json()["changed"]
    assert query(client, vectors2[9]).json()["version"] == v2
    assert query(client, vectors1[9], version=v1).json()["version"] == v1  # previous: still held, still pinnable
    draining = client.post("/admin/rollout/retire", json={"version": v1})
    assert draining.status_code == 409 and "draining" in draining.json()["error"]["message"]
    retired = client.post("/admin/rollout/retire", json={"version": v1, "force": True}).json()
    assert retired["changed"] and retired["state"]["previous"] is None
    assert not client.post("/admin/rollout/retire", json={"version": v1, "force": True}).json()["changed"]
    gone = query(client, vectors1[9], version=v1)
    assert gone.status_code == 409 and gone.json()["error"]["field"] == "version"
    replicas = gateway.client.replicas
    assert all(v1 not in [v.id for v in replicas[r].describe()] for r in replicas)  # unloaded from the replicas
    events = [e["kind"] for e in client.get("/admin/rollout").json()["state"]["events"]]
    assert events == ["VersionStaged", "VersionSynced", "VersionActivated", "VersionRetired"]
    assert 'shardrag_gateway_rollout_events_total{kind="VersionActivated"} 1.0' in client.get("/metrics").text


def test_rollback_and_abort(cluster):
    client, gateway, (v1, _), (v2, vectors2), _ = cluster
    client.post("/admin/rollout/stage", json={"version": v2})
    wait_ready(gateway, client, v2)
    client.post("/admin/rollout/activate", json={"version": v2, "force": True})
    back = client.post("/admin/rollout/rollback", json={"version": v1}).json()
    assert back["state"]["active"] == v1 and back["state"]["previous"] == v2
    assert query(client, vectors2[1]).json()["version"] == v1
    client.post("/admin/rollout/retire", json={"version": v2, "force": True})
    client.post("/admin/rollout/stage", json={"version": v2})
    aborted = client.post("/admin/rollout/abort", json={"version": v2}).json()
    assert aborted["changed"] and aborted["state"]["staged"] is None
    assert not client.post("/admin/rollout/abort", json={"version": v2}).json()["changed"]


def test_refusals_name_the_reason(cluster):
    client, gateway, (v1, _), (v2, _), root = cluster
    missing = client.post("/admin/rollout/stage", json={"version": "nope.w00.p00"})
    assert missing.status_code == 409 and "no shard" in missing.json()["error"]["message"]
    not_staged = client.post("/admin/rollout/activate", json={"version": v2, "force": True})
    assert not_staged.status_code == 409 and "not staged" in not_staged.json()["error"]["message"]
    # a damaged shard of V2: its replica fails to load it, activation says which and why
    path = shard_dir(root / "c" / v2, 1) / "index.faiss"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    client.post("/admin/rollout/stage", json={"version": v2})
    for _ in range(200):
        report = client.get("/admin/rollout").json()["replicas"][v2]
        if report["1"][0]["state"] == "failed":
            break
    refused = client.post("/admin/rollout/activate", json={"version": v2, "force": True})
    message = refused.json()["error"]["message"]
    assert refused.status_code == 409 and "shard 1: 0/1 replicas ready" in message and "index.faiss" in message
    assert client.get("/admin/rollout").json()["state"]["active"] == v1
    assert client.post("/admin/rollout/abort", json={"version": v2}).json()["state"]["staged"] is None


def test_bad_admin_bodies(cluster):
    client = cluster[0]
    assert client.post("/admin/rollout/stage", json={}).status_code == 422
    response = client.post("/admin/rollout/activate", json={"version": "x", "bogus": 1})
    assert response.status_code == 422 and response.json()["error"]["field"] == "bogus"


def test_state_survives_a_gateway_restart(cluster):
    client, gateway, (v1, _), (v2, vectors2), root = cluster
    client.post("/admin/rollout/stage", json={"version": v2})
    wait_ready(gateway, client, v2)
    client.post("/admin/rollout/activate", json={"version": v2, "force": True})
    # a second gateway over the same replicas and state file (a restart, or a peer) serves V2 at once
    config = GatewayConfig.from_dict({"encoder": {"load": False},
                                      "rollout": {"state_path": str(root / "rollout.json")}})
    peer = GatewaySetup(config, gateway.shard_replicas, shard_client=gateway.client)
    with TestClient(create_app(peer)) as other:
        state = other.get("/admin/rollout").json()["state"]
        assert (state["active"], state["previous"]) == (v2, v1)
        assert other.post("/v1/query", json={"vector": vectors2[0].tolist(), "k": 3}).json()["version"] == v2


def test_two_gateways_agree_within_one_poll_interval(cluster):
    import time

    client, gateway, (v1, _), (v2, vectors2), root = cluster
    config = GatewayConfig.from_dict({"encoder": {"load": False},
                                      "rollout": {"poll_interval_s": 0.2, "state_path": str(root / "rollout.json")}})
    peer = GatewaySetup(config, gateway.shard_replicas, shard_client=gateway.client)
    with TestClient(create_app(peer)) as other:
        client.post("/admin/rollout/stage", json={"version": v2})
        wait_ready(gateway, client, v2)
        client.post("/admin/rollout/activate", json={"version": v2, "force": True})
        switched = time.monotonic()
        while other.post("/v1/query", json={"vector": vectors2[0].tolist(), "k": 3}).json()["version"] != v2:
            assert time.monotonic() - switched < 0.2 + 0.5, "the peer did not follow within a poll interval"
            time.sleep(0.02)
