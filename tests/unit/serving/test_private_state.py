"""A lone gateway (no coordinator, no shared state path) keeps its cluster state in a private
scratch folder: the folder is removed when the gateway closes, so gateway restarts do not pile
folders up in the temporary directory."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from clusterstate.local import LocalKV
from serving.gateway.app import create_app, gateway_of
from serving.gateway.config import GatewayConfig
from serving.gateway.factory import GatewaySetup
from serving.transport.inprocess import InProcessShardClient
from tests.conftest import random_corpus
from tests.unit.serving.gateway_harness import build


def test_a_lone_gateways_private_state_folder_goes_with_it(tmp_path):
    documents, vectors, version = random_corpus(n=60, dim=16)
    shards = build(tmp_path, "c", documents, vectors, version, 2, "hash")
    shard_client, replicas = InProcessShardClient.of(shards)
    app = create_app(GatewaySetup(GatewayConfig.from_dict({"encoder": {"load": False}}), replicas,
                                  shard_client=shard_client))
    with TestClient(app) as client:
        kv = gateway_of(app).cluster.state.kv
        assert isinstance(kv, LocalKV)
        folder = Path(kv.path).parent
        assert folder.is_dir() and not folder.is_relative_to(tmp_path)  # the gateway's own, not the collection's
        assert client.post("/v1/query", json={"vector": vectors[0].tolist(), "k": 3}).status_code == 200
    assert not folder.exists()


def test_a_shared_local_state_is_not_removed_by_a_closing_gateway(tmp_path):
    shared = LocalKV(tmp_path / "state" / "cluster-state.json")
    shared.put("k", b"v")
    shared.close()
    assert (tmp_path / "state" / "cluster-state.json").exists()
