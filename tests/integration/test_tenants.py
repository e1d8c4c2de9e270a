"""Keys that cannot cross collections or tenants, against a real cluster (a gateway, a node):
hand-written attacks on every endpoint, then schemathesis with a tenant's key over the whole
schema. Two tenants write the same ids into one collection; neither ever receives, overwrites or
deletes the other's documents, whatever filter, id or delete-by-filter it sends. Quotas answer
429 naming the limit."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.conftest import random_corpus

pytestmark = pytest.mark.slow

ADMIN = secrets.token_urlsafe(24)
ALPHA = secrets.token_urlsafe(24)  # read, collection alpha only
ACME = secrets.token_urlsafe(24)  # write, collection shared, tenant acme
GLOBEX = secrets.token_urlsafe(24)  # write, collection shared, tenant globex
SLOW = secrets.token_urlsafe(24)  # read, 2 requests/s of its own
INITECH = secrets.token_urlsafe(24)  # write, collection shared, tenant initech: the fuzzer's
DIM = 8
PER_TENANT = 20


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def vectors(seed: int, n: int = PER_TENANT) -> np.ndarray:
    found = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return found / np.linalg.norm(found, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    docs, vecs, version = random_corpus(40, DIM)
    build_collection(root, docs, vecs, version, BuildConfig("base", 1), show_progress=False)
    keys = [f"admin:{ADMIN}", f"read:{ALPHA} collections=alpha", f"write:{ACME} collections=shared tenant=acme",
            f"write:{GLOBEX} collections=shared+alpha tenant=globex", f"read:{SLOW} rps=2",
            f"write:{INITECH} collections=shared tenant=initech"]
    # a deadline floor of 1 s (as test_fuzz_api): the fuzzer's 1 ms deadline would be a 504 by design
    config = GatewayConfig.from_dict({"encoder": {"load": False}, "writes": {"max_documents": 50},
                                      "limits": {"min_timeout_ms": 1000}})
    with LocalCluster(root, "base", replicas=1, gateway=config, nodes=1, api_keys=keys,
                      workdir=tmp_path_factory.mktemp("work")) as running:
        url = running.gateway_url
        for name, extra in (("alpha", {}), ("beta", {}), ("shared", {"tenant_field": "tenant", "shards": 2}),
                            ("small", {"quotas": {"max_documents": 5}})):
            created = httpx.put(f"{url}/v1/collections/{name}", json={"dim": DIM, **extra}, headers=bearer(ADMIN),
                                timeout=60)
            assert created.status_code == 201, created.text
        for tenant, key, seed in (("acme", ACME, 1), ("globex", GLOBEX, 2)):
            batch = [{"id": f"doc-{i}", "vector": v.tolist(), "title": tenant, "metadata": {"n": i}}
                     for i, v in enumerate(vectors(seed))]  # the same ids for both tenants
            written = httpx.post(f"{url}/v1/collections/shared/documents", json={"documents": batch},
                                 headers=bearer(key), timeout=30)
            assert written.status_code == 200, written.text
            assert written.json()["ids"][0] == "doc-0"  # shown in the tenant's namespace
        yield running


def query(url: str, key: str, body: dict, collection: str = "shared") -> httpx.Response:
    return httpx.post(f"{url}/v1/collections/{collection}/query", json={"with_metadata": True, **body},
                      headers=bearer(key), timeout=30)


def test_a_collection_key_reaches_its_collections_only(cluster):
    url = cluster.gateway_url
    probe = {"vector": vectors(9, 1)[0].tolist(), "k": 3}
    assert query(url, ALPHA, probe, "alpha").status_code == 200
    for method, path, body in (("POST", "/v1/collections/beta/query", probe), ("GET", "/v1/collections/beta", None),
                               ("POST", "/v1/collections/beta/documents", {"documents": [{"id": "x", "vector":
                                                                                          probe["vector"]}]}),
                               ("POST", "/v1/collections/beta/documents/delete", {"ids": ["x"]}),
                               ("GET", "/v1/collections/beta/documents/x", None), ("POST", "/v1/query", probe),
                               ("GET", "/v1/cluster", None), ("DELETE", "/v1/collections/alpha", None),
                               ("PUT", "/v1/collections/gamma", {"dim": 4})):
        answer = httpx.request(method, f"{url}{path}", json=body, headers=bearer(ALPHA), timeout=30)
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.json()["error"]["field"] == "authorization"
    listed = httpx.get(f"{url}/v1/collections", headers=bearer(ALPHA)).json()["collections"]
    assert [row["name"] for row in listed] == ["alpha"]
    assert query(url, ADMIN, probe, "beta").status_code == 200  # an unscoped key reaches every collection


def test_a_tenant_never_receives_another_tenants_documents(cluster):
    url = cluster.gateway_url
    acme_vectors, globex_vectors = vectors(1), vectors(2)
    # k = its own count, aimed at a globex document: without the tenant filter inside the shards the
    # top 20 would be mostly globex's (dropped on the way out), and fewer than 20 would come back
    everything = query(url, ACME, {"vector": globex_vectors[3].tolist(), "k": PER_TENANT})
    assert everything.status_code == 200, everything.text
    hits = everything.json()["hits"]
    # all of its own 20 (not fewer: the confinement is a filter inside the shards, not hits dropped after)
    assert sorted(h["doc_id"] for h in hits) == sorted(f"doc-{i}" for i in range(PER_TENANT)), {
        k: v for k, v in everything.json().items() if k != "hits"}
    assert {h["title"] for h in hits} == {"acme"} and {h["metadata"]["tenant"] for h in hits} == {"acme"}
    hostile_filters = [
        {"must": [{"key": "tenant", "match": {"value": "globex"}}]},
        {"should": [{"key": "tenant", "match": {"value": "globex"}}, {"key": "tenant", "match": {"value": "acme"}}]},
        {"must_not": [{"key": "tenant", "match": {"value": "acme"}}]},
        {"must": [{"has_id": ["globex::doc-3", "doc-3"]}]},
        {"must": [{"key": "tenant", "match": {"any": ["globex", "acme"]}}]},
    ]
    for hostile in hostile_filters:
        answer = query(url, ACME, {"vector": globex_vectors[3].tolist(), "k": 40, "filter": hostile})
        assert answer.status_code == 200, answer.text
        assert {h["title"] for h in answer.json()["hits"]} <= {"acme"}, hostile
        assert all(not h["doc_id"].startswith("globex") for h in answer.json()["hits"]), hostile
    own = httpx.get(f"{url}/v1/collections/shared/documents/doc-3", headers=bearer(ACME)).json()
    assert own["title"] == "acme" and own["id"] == "doc-3"
    for other in ("globex::doc-3", "../globex::doc-3"):
        assert httpx.get(f"{url}/v1/collections/shared/documents/{other}", headers=bearer(ACME)).status_code == 404
    stolen = httpx.post(f"{url}/v1/collections/shared/documents", headers=bearer(ACME), json={"documents": [
        {"id": "doc-5", "vector": acme_vectors[5].tolist(), "title": "acme", "metadata": {"tenant": "globex"}}]})
    assert stolen.status_code == 403 and stolen.json()["error"]["field"] == "documents.0.metadata.tenant"
    # delete-by-filter aimed at the other tenant, and deletes by the ids they share
    wiped = httpx.post(f"{url}/v1/collections/shared/documents/delete", headers=bearer(ACME),
                       json={"filter": {"key": "tenant", "match": {"value": "globex"}}})
    assert wiped.status_code == 200 and wiped.json()["ids"] == []
    gone = httpx.post(f"{url}/v1/collections/shared/documents/delete", headers=bearer(ACME),
                      json={"ids": ["doc-7", "globex::doc-8"]})
    assert gone.status_code == 200
    assert httpx.get(f"{url}/v1/collections/shared/documents/doc-7", headers=bearer(ACME)).status_code == 404
    for i in (7, 8):  # globex keeps both
        kept = httpx.get(f"{url}/v1/collections/shared/documents/doc-{i}", headers=bearer(GLOBEX))
        assert kept.status_code == 200 and kept.json()["title"] == "globex"
    theirs = query(url, GLOBEX, {"vector": acme_vectors[0].tolist(), "k": 40}).json()["hits"]
    assert len(theirs) == PER_TENANT and {h["title"] for h in theirs} == {"globex"}
    # an unscoped key sees the stored ids, both tenants
    both = query(url, ADMIN, {"vector": acme_vectors[0].tolist(), "k": 60}).json()["hits"]
    assert {"acme", "globex"} <= {h["doc_id"].split("::")[0] for h in both}
    # what a tenant key may not do at all
    assert httpx.delete(f"{url}/v1/collections/shared", headers=bearer(ACME)).status_code == 403
    assert query(url, GLOBEX, {"vector": acme_vectors[0].tolist()}, "alpha").status_code == 403  # no tenant field


def test_a_tenants_listing_holds_its_documents_only(cluster):
    """scroll with a tenant's key: its own documents in its namespace, page by page (the cursor is a
    shown id), and a hostile filter or cursor cannot reach another tenant's."""
    url = cluster.gateway_url

    def scroll(body: dict) -> dict:
        answer = httpx.post(f"{url}/v1/collections/shared/documents/scroll", json=body, headers=bearer(GLOBEX),
                            timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    listed, offset = [], None
    while True:
        page = scroll({"limit": 7, **({"offset": offset} if offset else {})})
        assert page["count"] == PER_TENANT
        listed.extend(page["documents"])
        offset = page["next_offset"]
        if offset is None:
            break
    assert [d["id"] for d in listed] == sorted(f"doc-{i}" for i in range(PER_TENANT))
    assert {d["title"] for d in listed} == {"globex"}
    for hostile in ({"must": [{"key": "tenant", "match": {"value": "acme"}}]}, {"must": [{"has_id": ["acme::doc-3"]}]},
                    {"must_not": [{"key": "tenant", "match": {"value": "globex"}}]}):
        assert scroll({"filter": hostile})["documents"] == [], hostile
    # a cursor is in its namespace too: "acme::doc-3" is globex::acme::doc-3, before globex's own ids
    assert {d["title"] for d in scroll({"offset": "acme::doc-3", "limit": 50})["documents"]} == {"globex"}
    everyone = httpx.post(f"{url}/v1/collections/shared/documents/scroll", json={"limit": 0}, headers=bearer(ADMIN))
    assert everyone.json()["count"] >= 2 * PER_TENANT - 1


def test_quotas_answer_429_naming_the_limit(cluster):
    url = cluster.gateway_url
    batch = [{"id": f"q-{i}", "vector": v.tolist()} for i, v in enumerate(vectors(5, 6))]
    assert httpx.post(f"{url}/v1/collections/small/documents", json={"documents": batch[:4]},
                      headers=bearer(ADMIN)).status_code == 200
    over = httpx.post(f"{url}/v1/collections/small/documents", json={"documents": batch[4:]}, headers=bearer(ADMIN))
    assert over.status_code == 429 and over.json()["error"]["field"] == "max_documents"
    assert "at most 5 documents" in over.json()["error"]["message"]
    statuses = [httpx.post(f"{url}/v1/collections/alpha/query", json={"vector": batch[0]["vector"]},
                           headers=bearer(SLOW)).status_code for _ in range(6)]
    assert 200 in statuses and 429 in statuses, statuses
    limited = httpx.post(f"{url}/v1/collections/alpha/query", json={"vector": batch[0]["vector"]},
                         headers=bearer(SLOW))
    assert limited.status_code == 429 and limited.json()["error"]["field"] == "rps"
    assert int(limited.headers["retry-after"]) >= 1


def test_schemathesis_with_a_tenant_key_finds_nothing(cluster, tmp_path):
    # Every operation of the schema, with the collection in the path fixed to the tenant's own
    # (a random name would only ever meet the 403 of the scope check).
    config = tmp_path / "schemathesis.toml"
    config.write_text(Path(__file__).with_name("schemathesis.toml").read_text()
                      + '\n[parameters]\n"path.name" = "shared"\n')
    command = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "run",
               f"{cluster.gateway_url}/openapi.json", "-H", f"Authorization: Bearer {INITECH}",
               "--phases", "examples,fuzzing", "--max-examples", "15", "--workers", "1", "--seed", "20261204"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # and the fuzzing (writes, deletes by id and filter) left the other tenants whole
    for tenant, key in (("globex", GLOBEX), ("acme", ACME)):
        theirs = query(cluster.gateway_url, key, {"vector": vectors(1)[0].tolist(), "k": 40}).json()["hits"]
        assert len(theirs) >= PER_TENANT - 1 and {h["title"] for h in theirs} == {tenant}
