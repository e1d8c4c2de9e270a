"""TLS on the gateway and on every internal hop, with a CA and certificate made in the test."""

from __future__ import annotations

import secrets
import ssl

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.certs import make_certificates

pytestmark = pytest.mark.slow
READ = secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, msmarco):
    root = tmp_path_factory.mktemp("root")
    build_collection(root, msmarco.documents, msmarco.vectors, msmarco.version, BuildConfig("tls", 2),
                     show_progress=False)
    cert, key, ca = make_certificates(tmp_path_factory.mktemp("certs"))
    with LocalCluster(root, "tls", replicas=1, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                      workdir=tmp_path_factory.mktemp("work"), api_keys=[f"read:{READ}"],
                      internal_token=secrets.token_urlsafe(32), tls=(str(cert), str(key), str(ca))) as running:
        yield running, ca


def test_gateway_and_internal_hops_speak_tls(tls_cluster, msmarco):
    cluster, ca = tls_cluster
    assert cluster.gateway_url.startswith("https://")
    assert all(url.startswith("https://") for group in cluster.shard_urls for url in group)
    verify = ssl.create_default_context(cafile=str(ca))
    body = {"vector": msmarco.query_vectors[0].tolist(), "k": 5}
    response = httpx.post(f"{cluster.gateway_url}/v1/query", json=body, verify=verify,
                          headers={"authorization": f"Bearer {READ}"})
    assert response.status_code == 200, response.text  # the gateway reached both shards over TLS
    assert len(response.json()["hits"]) == 5 and not response.json()["partial"]
    with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA is refused
        httpx.post(f"{cluster.gateway_url}/v1/query", json=body)
    plain = cluster.gateway_url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):  # and plain HTTP gets nowhere
        httpx.post(f"{plain}/v1/query", json=body)
