"""Auth and limits with real processes: API keys with scopes at the gateway, the internal token
between the gateway and the shards, keys kept out of logs, per-key rate limits, every limit a 4xx."""

from __future__ import annotations

import secrets
import time

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

pytestmark = pytest.mark.slow

READ = secrets.token_urlsafe(24)
ADMIN = secrets.token_urlsafe(24)
THROTTLED = secrets.token_urlsafe(24)  # only the rate-limit test drains this key's bucket
PATIENT = secrets.token_urlsafe(24)  # ... and this one only the client-retry test
IMPATIENT = secrets.token_urlsafe(24)
TOKEN = secrets.token_urlsafe(32)
WRITE = secrets.token_urlsafe(24)
LIMITS = GatewayConfig.from_dict({"encoder": {"load": False}, "limits": {
    "max_k": 20, "max_body_bytes": 20_000, "max_timeout_ms": 2000, "default_timeout_ms": 2000,
    "rate_limit_qps": 5.0, "rate_limit_burst": 10}})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, msmarco):
    root = tmp_path_factory.mktemp("root")
    build_collection(root, msmarco.documents, msmarco.vectors, msmarco.version, BuildConfig("auth", 2),
                     show_progress=False)
    with LocalCluster(root, "auth", replicas=1, gateway=LIMITS, workdir=tmp_path_factory.mktemp("work"),
                      api_keys=[f"read:{READ}", f"admin:{ADMIN}", f"read:{THROTTLED}", f"write:{WRITE}",
                                f"read:{PATIENT}", f"read:{IMPATIENT}"],
                      internal_token=TOKEN) as running:
        yield running


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture()
def vector(msmarco):
    return msmarco.query_vectors[0].tolist()


def test_keys_and_scopes(cluster, vector):
    url = cluster.gateway_url
    body = {"vector": vector, "k": 5}
    anonymous = httpx.post(f"{url}/v1/query", json=body)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["field"] == "authorization"
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert httpx.post(f"{url}/v1/query", json=body, headers=bearer("x" * 30)).status_code == 401
    assert httpx.post(f"{url}/v1/query", json=body, headers={"x-api-key": READ}).status_code == 200
    assert httpx.post(f"{url}/v1/query", json=body, headers=bearer(READ)).status_code == 200
    assert httpx.get(f"{url}/v1/cluster", headers=bearer(READ)).status_code == 200
    forbidden = httpx.get(f"{url}/admin/rollout", headers=bearer(READ))
    assert forbidden.status_code == 403 and "admin" in forbidden.json()["error"]["message"]
    assert httpx.get(f"{url}/admin/rollout", headers=bearer(ADMIN)).status_code == 200
    assert httpx.post(f"{url}/v1/query", json=body, headers=bearer(ADMIN)).status_code == 200  # admin ⊇ read
    assert httpx.get(f"{url}/healthz").status_code == 200  # probes need no key


def test_writes_need_the_write_scope(cluster, vector):
    url = cluster.gateway_url
    doc = {"documents": [{"id": "scoped-doc", "vector": vector, "metadata": {"by": "write"}}]}
    forbidden = httpx.post(f"{url}/v1/documents", json=doc, headers=bearer(READ))
    assert forbidden.status_code == 403 and "write" in forbidden.json()["error"]["message"]
    assert forbidden.json()["error"]["field"] == "authorization"
    assert httpx.post(f"{url}/v1/documents", json=doc).status_code == 401
    assert httpx.post(f"{url}/v1/documents/delete", json={"ids": ["x"]}, headers=bearer(READ)).status_code == 403
    written = httpx.post(f"{url}/v1/documents", json=doc, headers=bearer(WRITE))
    assert written.status_code == 200, written.text
    assert httpx.get(f"{url}/v1/documents/scoped-doc", headers=bearer(READ)).json()["metadata"] == {"by": "write"}
    session = {"vector": vector, "k": 1, "consistency": "session", "min_seq": written.json()["seq"]}
    hits = httpx.post(f"{url}/v1/query", json=session, headers=bearer(WRITE)).json()["hits"]
    assert hits[0]["doc_id"] == "scoped-doc"
    assert httpx.get(f"{url}/admin/rollout", headers=bearer(WRITE)).status_code == 403  # write is not admin
    deleted = httpx.post(f"{url}/v1/documents/delete", json={"ids": ["scoped-doc"]}, headers=bearer(ADMIN))
    assert deleted.status_code == 200  # admin implies write


def test_shards_refuse_calls_without_the_internal_token(cluster):
    shard = cluster.shard_urls[0][0]
    assert httpx.get(f"{shard}/healthz").status_code == 200
    for headers in ({}, {"x-shardrag-token": "wrong"}):
        refused = httpx.get(f"{shard}/v1/info", headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["field"] == "x-shardrag-token"
        search = httpx.post(f"{shard}/v1/search?k=3&version=x", content=b"\0" * 1536, headers=headers)
        assert search.status_code == 401
    assert httpx.get(f"{shard}/v1/info", headers={"x-shardrag-token": TOKEN}).status_code == 200


def test_secrets_never_reach_the_logs(cluster, vector):
    httpx.post(f"{cluster.gateway_url}/v1/query", json={"vector": vector}, headers=bearer("wrong-" + READ))
    httpx.get(f"{cluster.gateway_url}/admin/rollout", headers=bearer(READ))
    logs = "".join(path.read_text(errors="replace") for path in cluster.workdir.glob("*.log"))
    assert logs
    for secret in (READ, ADMIN, THROTTLED, TOKEN, WRITE):
        assert secret not in logs


def test_every_limit_is_a_4xx_naming_it(cluster, vector):
    url, headers = cluster.gateway_url, bearer(ADMIN)
    cases = [
        ({"vector": vector, "k": 21}, 422, "k", "20"),
        ({"vector": vector, "timeout_ms": 2001}, 422, "timeout_ms", "2000"),
        ({"text": "x" * 5000}, 422, "text", "4096"),
        ({"vector": vector + [0.0] * 3000}, 413, "body", "20000"),
    ]
    for body, status, field, limit in cases:
        response = httpx.post(f"{url}/v1/query", json=body, headers=headers)
        assert response.status_code == status, (body.keys(), response.text)
        error = response.json()["error"]
        assert error["field"] == field and limit in error["message"], error


def test_rate_limit_gives_429_with_retry_after(cluster, vector):
    with httpx.Client(base_url=cluster.gateway_url, headers=bearer(THROTTLED), timeout=10) as client:
        statuses = [client.post("/v1/query", json={"vector": vector, "k": 1}) for _ in range(40)]
    limited = [r for r in statuses if r.status_code == 429]
    assert limited and all(r.status_code in (200, 429) for r in statuses)
    assert int(limited[0].headers["retry-after"]) >= 1
    assert limited[0].json()["error"]["field"] == "rate_limit"
    # the limit is per key: the admin key still has its own bucket
    assert httpx.post(f"{cluster.gateway_url}/v1/query", json={"vector": vector, "k": 1},
                      headers=bearer(ADMIN)).status_code == 200


def test_a_client_with_retries_waits_out_the_rate_limit_and_one_without_gets_the_429(cluster, vector):
    """25 queries at once against a 5 q/s limit with a burst of 10: the client with retries sends
    each refused one again after the gateway's Retry-After, so all 25 are answered; without
    retries the first refusal comes back as RateLimited."""
    from retrieval.client import ShardragClient
    from retrieval.errors import RateLimited

    with ShardragClient(cluster.gateway_url, api_key=PATIENT, retries=5) as client:
        started = time.monotonic()
        answered = [client.query(vector=vector, k=1) for _ in range(25)]
        assert all(len(reply["hits"]) == 1 for reply in answered)
        assert time.monotonic() - started >= 1.0  # it did wait
    with ShardragClient(cluster.gateway_url, api_key=IMPATIENT) as client, pytest.raises(RateLimited) as refused:
        for _ in range(25):
            client.query(vector=vector, k=1)
    assert refused.value.retry_after_s >= 1
