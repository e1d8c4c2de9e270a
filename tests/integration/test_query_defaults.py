"""A created collection's query defaults through a real cluster (shard processes, a node, two
gateways over one cluster state): set at create or later through the REST API, the CLI and both
clients, recorded in the spec, applied by every gateway to the queries that name no mode, fusion,
weights or rrf_k — a query's own fields always win — and bad input refused naming the field."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.client import AsyncShardragClient, ShardragClient
from retrieval.types import Document, EmbeddingVersion
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.gateway_process import Gateway

pytestmark = pytest.mark.slow

DIM = 8
TEXTS = ["fjords and glaciers of norway", "the glacier retreats each summer", "a harbour town by the fjord",
         "mountain huts above the tree line", "salmon rivers in the north", "winter light over the fjord"]


def unit(seed: int) -> list[float]:
    found = np.random.default_rng(seed).standard_normal(DIM)
    return (found / np.linalg.norm(found)).tolist()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    documents = [Document("base", "nothing to see", "Base")]
    build_collection(root, documents, np.asarray([unit(0)], dtype=np.float32), EmbeddingVersion("v", "0" * 64, DIM),
                     BuildConfig("base", 1), show_progress=False)
    work = tmp_path_factory.mktemp("work")
    with LocalCluster(root, "base", replicas=1, nodes=1, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                      workdir=work) as running:
        other = Gateway(work / "cluster.json", work / "gateway-2.log", tmp_path_factory.mktemp("homes"))
        other.start()
        try:
            yield running, other.url
        finally:
            other.stop()


def searched(http: httpx.Client, body: dict) -> dict:
    reply = http.post("/v1/collections/fjords/query", json={"k": 4, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def wait_for(http: httpx.Client, body: dict, fusion_prefix: str, timeout_s: float = 15.0) -> dict:
    """The other gateway adopts a spec change at its next refresh: poll until it shows."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = searched(http, body)
        if (answer["diagnostics"]["fusion"] or "").startswith(fusion_prefix) or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_defaults_set_at_create_and_later_apply_on_every_gateway(cluster):
    running, other_url = cluster
    defaults = {"mode": "hybrid", "fusion": "weighted", "weights": {"dense": 0.9, "lexical": 0.1}, "rrf_k": 60}
    with ShardragClient(running.gateway_url, timeout_s=60) as client, \
            httpx.Client(base_url=running.gateway_url, timeout=60) as http, \
            httpx.Client(base_url=other_url, timeout=60) as other:
        created = client.create_collection("fjords", dim=DIM, shards=2, query_defaults=defaults)
        assert created["query_defaults"] == defaults
        client.collection("fjords").upsert([{"id": f"d{i}", "title": "", "text": text, "vector": unit(i + 1)}
                                            for i, text in enumerate(TEXTS)])
        ask = {"text": "fjord glacier", "vector": unit(3)}  # both: what a hybrid query of a vector collection sends
        for gateway in (http, other):
            answer = searched(gateway, ask)
            diagnostics = answer["diagnostics"]
            assert diagnostics["mode"] == "hybrid" and diagnostics["defaulted"] == ["mode", "weights"]
            assert diagnostics["fusion"].startswith("weighted dense=0.9 lexical=0.1")
            explicit = searched(gateway, {**ask, "mode": "hybrid", "weights": {"dense": 0.9, "lexical": 0.1}})
            assert [(h["doc_id"], h["score"]) for h in answer["hits"]] == \
                [(h["doc_id"], h["score"]) for h in explicit["hits"]]
            assert explicit["diagnostics"]["defaulted"] == []
        # a query's own fields win: dense asked is dense (one of text and vector, as always)
        dense = searched(http, {"vector": unit(3), "mode": "dense"})["diagnostics"]
        assert (dense["mode"], dense["defaulted"]) == ("dense", [])
        assert searched(http, {"vector": unit(3)})["diagnostics"]["mode"] == "dense"  # no text: no lexical leg
        # text alone: the hybrid default's dense leg needs a vector in a collection without an encoder
        refused = http.post("/v1/collections/fjords/query", json={"text": "fjord"})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "text"
        assert "dense and hybrid search need one" in refused.json()["error"]["message"]

        # changed through the CLI (an rrf default), seen here at once and by the other gateway within its refresh
        done = subprocess.run([sys.executable, "-m", "serving", "collections", "defaults", "fjords", "--mode",
                               "hybrid", "--fusion", "rrf", "--rrf-k", "10", "--url", running.gateway_url],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "fjords: a query naming none gets mode hybrid, fusion rrf k=10"
        assert searched(http, ask)["diagnostics"]["fusion"].startswith("rrf k=10")
        adopted = wait_for(other, ask, "rrf k=10")["diagnostics"]
        assert adopted["fusion"].startswith("rrf k=10") and adopted["defaulted"] == ["mode", "fusion", "rrf_k"]
        # weights with no fusion named under an rrf default: refused as for an rrf query, never dropped
        weighted = http.post("/v1/collections/fjords/query", json={**ask, "weights": {"dense": 1, "lexical": 1}})
        assert weighted.status_code == 422 and weighted.json()["error"]["field"] == "weights"
        assert client.get_collection("fjords")["query_defaults"]["fusion"] == "rrf"
        listed = subprocess.run([sys.executable, "-m", "serving", "collections", "list", "--url",
                                 running.gateway_url], capture_output=True, text=True, timeout=120)
        assert "queries: mode hybrid, fusion rrf k=10" in listed.stdout, listed.stdout

        # lexical through the async client: text alone now searches BM25
        async def lexical_default() -> dict:
            async with AsyncShardragClient(running.gateway_url, timeout_s=60) as aclient:
                await aclient.set_query_defaults("fjords", mode="lexical")
                return await aclient.collection("fjords").query(text="glacier", k=3)
        answer = asyncio.run(lexical_default())
        assert answer["diagnostics"]["mode"] == "lexical" and answer["diagnostics"]["defaulted"] == ["mode"]
        assert {h["doc_id"] for h in answer["hits"]} == {"d0", "d1"}
        # back to plain: a text query of a vector collection needs a vector again
        client.set_query_defaults("fjords")
        assert client.get_collection("fjords")["query_defaults"] == {"mode": "dense", "fusion": "weighted",
                                                                     "weights": None, "rrf_k": 60}


@pytest.mark.parametrize("body, status, field", [
    ({"mode": "sparse"}, 422, "mode"),
    ({"weights": {"dense": 0, "lexical": 0}}, 422, "weights"),
    ({"weights": {"dense": -1, "lexical": 1}}, 422, "weights.dense"),
    ({"rrf_k": True}, 422, "rrf_k"),
    ({"rrf_k": 10_001}, 422, "rrf_k"),
    ({"mode": "hybrid", "alpha": 0.5}, 422, "alpha"),
])
def test_bad_defaults_are_refused_naming_the_field(cluster, body, status, field):
    running, _ = cluster
    with httpx.Client(base_url=running.gateway_url, timeout=60) as http:
        if http.get("/v1/collections/strict").status_code == 404:
            assert http.put("/v1/collections/strict", json={"dim": DIM}).status_code == 201
        before = http.get("/v1/collections/strict").json()["query_defaults"]
        reply = http.put("/v1/collections/strict/query-defaults", json=body)
        assert reply.status_code == status and reply.json()["error"]["field"] == field, reply.text
        assert http.get("/v1/collections/strict").json()["query_defaults"] == before  # nothing changed
        created = http.put("/v1/collections/strict2", json={"dim": DIM, "query_defaults": body})
        assert created.status_code == status and created.json()["error"]["field"] == f"query_defaults.{field}"
        assert http.get("/v1/collections/strict2").status_code == 404


def test_the_started_with_collection_and_unknown_ones_are_refused(cluster):
    running, _ = cluster
    with httpx.Client(base_url=running.gateway_url, timeout=60) as http:
        started = http.put("/v1/collections/base/query-defaults", json={"mode": "hybrid"})
        assert started.status_code == 409 and started.json()["error"]["field"] == "name"
        assert "query_defaults" in started.json()["error"]["message"]
        unknown = http.put("/v1/collections/nowhere/query-defaults", json={"mode": "hybrid"})
        assert unknown.status_code == 404


def test_the_cli_queries_and_deletes_in_a_named_collection_under_its_defaults(cluster):
    running, _ = cluster
    with ShardragClient(running.gateway_url, timeout_s=60) as client:
        client.create_collection("lakes", dim=DIM, shards=2, query_defaults={"mode": "lexical"})
        client.collection("lakes").upsert([{"id": f"d{i}", "title": "", "text": text, "vector": unit(i + 1)}
                                           for i, text in enumerate(TEXTS)])

        def cli(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "serving", *argv, "--url", running.gateway_url],
                                  capture_output=True, text=True, timeout=120)

        asked = cli("query", "glacier", "--collection", "lakes", "-k", "3", "--json")
        assert asked.returncode == 0, asked.stderr
        answer = json.loads(asked.stdout)
        # the collection's own default (lexical: text alone, no encoder needed) and its documents
        assert answer["diagnostics"]["mode"] == "lexical" and answer["diagnostics"]["defaulted"] == ["mode"]
        assert {h["doc_id"] for h in answer["hits"]} == {"d0", "d1"}
        deleted = cli("delete", "--ids", "d0", "--collection", "lakes")
        assert deleted.returncode == 0 and json.loads(deleted.stdout)["ids"] == ["d0"], deleted.stderr
        again = json.loads(cli("query", "glacier", "--collection", "lakes", "--json").stdout)
        assert {h["doc_id"] for h in again["hits"]} == {"d1"}
        missing = cli("query", "glacier", "--collection", "no-such-lake")
        assert missing.returncode != 0 and "no-such-lake" in missing.stderr
