"""A collection's lexical language through the REST API of a real cluster (shard processes, a
node, the gateway): a German collection built with ``lexical_language=german`` and one created
through ``PUT /v1/collections/{name}`` find inflected forms ("Häuser" for "Haus"), the gateway
guesses the statistics with the same analysis (a repeated query takes one round, not two), and
an unknown language is a 422 naming the field."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.client import ShardragClient
from retrieval.types import Document, EmbeddingVersion
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.metrics import lexical_rounds
from tests.unit.index_shards.test_lexical_language import GERMAN as GERMAN_BASE

pytestmark = pytest.mark.slow

DIM = 8
GERMAN = [*GERMAN_BASE, Document("wald", "Im Wald stehen alte Bäume", "Wälder")]


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    found = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return found / np.linalg.norm(found, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    build_collection(root, GERMAN, unit_vectors(len(GERMAN)), EmbeddingVersion("de", "0" * 64, DIM),
                     BuildConfig("de", 2, lexical_language="german"), show_progress=False)
    with LocalCluster(root, "de", replicas=1, nodes=1, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                      workdir=tmp_path_factory.mktemp("work")) as running:
        yield running


def test_a_german_collection_is_searched_in_german(cluster):
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
        first = http.post("/v1/query", json={"text": "Haus", "mode": "lexical", "k": 5})  # the same stem
        assert first.status_code == 200, first.text
        assert {h["doc_id"] for h in first.json()["hits"]} == {"see", "stadt"}  # both hold "Häuser"
        assert [h["doc_id"] for h in http.post("/v1/query", json={"text": "Bäume im Wäldern", "mode": "lexical",
                                                                   "k": 1}).json()["hits"]] == ["wald"]
        # the gateway analyses the query as the shards do (English would keep "häuser"): once it has
        # seen the terms, one round
        plural = http.post("/v1/query", json={"text": "Häuser", "mode": "lexical", "k": 5})
        assert plural.json()["hits"] == first.json()["hits"]
        before = lexical_rounds(http)
        again = http.post("/v1/query", json={"text": "Häuser", "mode": "lexical", "k": 5})
        assert again.json()["hits"] == first.json()["hits"]
        one, two = (after - then for after, then in zip(lexical_rounds(http), before, strict=True))
        assert (one, two) == (1, 0)
        hybrid = http.post("/v1/query", json={"text": "Gärten", "vector": unit_vectors(1, 7)[0].tolist(),
                                              "mode": "hybrid", "k": 6})
        assert hybrid.status_code == 200, hybrid.text
        garden = next(h for h in hybrid.json()["hits"] if h["doc_id"] == "garten")
        assert garden["legs"]["lexical"]["rank"] == 1
        # the diagnostics name the terms searched: stemmed in German, the stop words dropped
        worded = http.post("/v1/query", json={"text": "die Häuser und die Gärten", "mode": "lexical", "k": 5}).json()
        assert worded["diagnostics"]["lexical_terms"] == ["haus", "gart"]
        nothing = http.post("/v1/query", json={"text": "und die der", "mode": "lexical", "k": 5}).json()
        assert nothing["hits"] == [] and nothing["diagnostics"]["lexical_terms"] == []


def test_a_created_collection_takes_its_language_and_refuses_an_unknown_one(cluster):
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
        refused = http.put("/v1/collections/klingon", json={"dim": DIM, "lexical_language": "klingon"})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "lexical_language", refused.text
        created = http.put("/v1/collections/fr", json={"dim": DIM, "shards": 2, "lexical_language": "french"})
        assert created.status_code == 201, created.text
        assert http.get("/v1/collections/fr").json()["lexical_language"] == "french"
        documents = [{"id": "chevaux", "title": "Les chevaux", "text": "Des chevaux courent dans les prés",
                      "vector": unit_vectors(1, 1)[0].tolist()},
                     {"id": "maison", "title": "La maison", "text": "Une maison blanche près de la mer",
                      "vector": unit_vectors(1, 2)[0].tolist()}]
        written = http.post("/v1/collections/fr/documents", json={"documents": documents})
        assert written.status_code == 200, written.text
        # French stems: "courir"/"courent" differ, but "cheval"/"chevaux" and "maisons"/"maison" meet
        hits = http.post("/v1/collections/fr/query", json={"text": "maisons", "mode": "lexical", "k": 2}).json()
        assert [h["doc_id"] for h in hits["hits"]] == ["maison"]
    with ShardragClient(cluster.gateway_url) as client:  # the client passes it on
        assert client.create_collection("es", dim=DIM, lexical_language="spanish")["lexical_language"] == "spanish"
