"""Every kind of bad input gets a 4xx JSON error naming the field; never a 500."""

import json
import re
from urllib.parse import quote

import jsonschema
import numpy as np
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from serving.gateway.config import GatewayConfig
from tests.conftest import random_corpus
from tests.unit.serving.gateway_harness import build, gateway_client

DIM = 32


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    documents, vectors, version = random_corpus(dim=DIM)
    shards = build(tmp_path_factory.mktemp("bad"), "c", documents, vectors, version, 2, "hash")
    config = GatewayConfig.from_dict({"encoder": {"load": False},
                                      "limits": {"max_k": 50, "max_body_bytes": 64 * 1024, "max_timeout_ms": 10_000}})
    with gateway_client(shards, config) as test_client:
        yield test_client


GOOD = [0.1] * DIM


def query_request_validator(client) -> jsonschema.Draft202012Validator:
    """The served schema's QueryRequest, as a validator (its references resolved in the document)."""
    schema = client.get("/openapi.json").json()
    return jsonschema.Draft202012Validator(
        {**schema["components"]["schemas"]["QueryRequest"], "components": schema["components"]},
        registry=Registry().with_resource("", Resource.from_contents(schema, DRAFT202012)))


def post_raw(client, body: bytes | str):
    return client.post("/v1/query", content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("payload, status, field", [
    ({"vector": [0.1] * (DIM - 1)}, 422, "vector"),
    ({"vector": [0.1] * DIM + [0.2]}, 422, "vector"),
    ({"vector": [1e39] + [0.1] * (DIM - 1)}, 422, "vector"),  # finite in JSON, inf in float32
    ({"vector": GOOD, "k": 0}, 422, "k"),
    ({"vector": GOOD, "k": -3}, 422, "k"),
    ({"vector": GOOD, "k": 51}, 422, "k"),
    ({"vector": GOOD, "k": "5"}, 422, "k"),
    ({"vector": GOOD, "k": 2.5}, 422, "k"),
    ({"text": ""}, 422, "text"),
    ({"text": "   \n"}, 422, "text"),
    ({"text": "x" * 5000}, 422, "text"),
    ({"vector": GOOD, "text": "both"}, 422, "text"),
    ({}, 422, "vector"),
    ({"vector": GOOD, "colour": "blue"}, 422, "colour"),
    ({"vector": GOOD, "top_m": 1}, 422, "top_m"),  # hash collection: no centroids
    ({"vector": GOOD, "top_m": 0}, 422, "top_m"),
    ({"vector": GOOD, "timeout_ms": 0}, 422, "timeout_ms"),
    ({"vector": GOOD, "timeout_ms": 10_001}, 422, "timeout_ms"),
    ({"vector": GOOD, "nprobe": 4}, 422, "nprobe"),  # Flat shards have no nprobe
    ({"vector": GOOD, "ef_search": 0}, 422, "ef_search"),
    ({"vector": GOOD, "version": "someone-else"}, 409, "version"),
    ({"vector": ["a"] * DIM}, 422, "vector.0"),
    ({"vector": "not a list"}, 422, "vector"),
    ({"vector": GOOD, "allow_partial": "yes"}, 422, "allow_partial"),
    ({"vector": GOOD, "filter": "lang=en"}, 422, "filter"),
    ({"vector": GOOD, "filter": {"must": [{"key": "lang", "eq": "en"}]}}, 422, "filter.must[0].eq"),
    ({"vector": GOOD, "filter": {"must": [{"key": "year", "range": {"gte": "2020"}}]}}, 422,
     "filter.must[0].range.gte"),
    ({"vector": GOOD, "filter": {"should": [{}, {"must": [{"has_id": []}]}]}}, 422, "filter.should[1].must[0].has_id"),
    ({"vector": GOOD, "filter": {"must": [{"must": [{"must": [{"must": [{"must": [{}]}]}]}]}]}}, 422,
     "filter.must[0].must[0].must[0].must[0].must[0]"),
    ({"vector": GOOD, "with_metadata": "yes"}, 422, "with_metadata"),
    # a fusion's fields where they would be ignored (a dense query its sender thinks hybrid, ...)
    ({"vector": GOOD, "fusion": "rrf"}, 422, "fusion"),
    ({"vector": GOOD, "rrf_k": 10}, 422, "rrf_k"),
    ({"vector": GOOD, "weights": {"dense": 1.0}}, 422, "weights"),
    ({"vector": GOOD, "candidates": 30}, 422, "candidates"),
    ({"text": "x", "mode": "lexical", "fusion": "weighted"}, 422, "fusion"),
    ({"text": "x", "vector": GOOD, "mode": "hybrid", "fusion": "rrf", "weights": {"dense": 1.0}}, 422, "weights"),
    ({"text": "x", "vector": GOOD, "mode": "hybrid", "rrf_k": 10}, 422, "rrf_k"),  # the default fusion: weighted
    ({"text": "x", "vector": GOOD, "mode": "hybrid", "weights": {"dense": 0, "lexical": 0.0}}, 422, "weights"),
])
def test_bad_fields(client, payload, status, field):
    response = client.post("/v1/query", json=payload)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    assert error["message"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers(client, literal):
    body = '{"vector": [' + ", ".join([literal] + ["0.1"] * (DIM - 1)) + "]}"
    response = post_raw(client, body)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["field"] in ("vector", "vector.0", "body")


@pytest.mark.parametrize("body", ["{not json", "", "[1, 2]", "null", '{"vector": [0.1, ]}', "\xff\xfe"])
def test_malformed_bodies(client, body):
    response = post_raw(client, body.encode("latin-1") if body.startswith("\xff") else body)
    assert response.status_code in (400, 422), response.text
    assert response.json()["error"]["field"] in ("body",)


def test_oversize_body_is_413(client):
    response = post_raw(client, json.dumps({"vector": GOOD, "text": "x" * 100_000}))
    assert response.status_code == 413
    assert response.json()["error"]["field"] == "body"


def test_text_without_encoder_is_503_naming_text(client):
    response = client.post("/v1/query", json={"text": "hello"})
    assert response.status_code == 503 and response.json()["error"]["field"] == "text"


# The schema's non-blank pattern and the gateway's check must agree character for character
# (JSON Schema's \S and Python's strip() do not: U+001C-U+001F, U+0085, U+FEFF).
EDGE_TEXTS = ["\x1c", "\x1f ", "\x85", "\ufeff", " \u3000\u2028", "\u200b", "\x00", "x\x1e"]


@pytest.mark.parametrize("text", EDGE_TEXTS)
def test_a_query_text_is_refused_as_blank_exactly_where_the_schema_says_so(client, text):
    validator = query_request_validator(client)
    response = client.post("/v1/query", json={"text": text})
    assert response.json()["error"]["field"] == "text"
    # allowed by the schema: past the blank check (503: this gateway has no encoder); else a 422
    assert response.status_code == (503 if validator.is_valid({"text": text}) else 422), response.text


@pytest.mark.parametrize("doc_id", EDGE_TEXTS)
def test_a_document_path_id_is_refused_as_blank_exactly_where_the_schema_says_so(client, doc_id):
    schema = client.get("/openapi.json").json()
    (parameter,) = schema["paths"]["/v1/documents/{doc_id}"]["get"]["parameters"]
    allowed = jsonschema.Draft202012Validator(parameter["schema"]).is_valid(doc_id)
    response = client.get("/v1/documents/" + quote(doc_id, safe=""))
    if allowed:
        assert response.status_code == 404, response.text  # no such document: looked for, not refused
    else:
        assert response.status_code == 422 and response.json()["error"]["field"] == "id", response.text


def test_still_serving_after_bad_input(client):
    response = client.post("/v1/query", json={"vector": GOOD, "k": 3})
    assert response.status_code == 200
    assert len(response.json()["hits"]) == 3


def test_openapi_documents_query_and_errors(client):
    schema = client.get("/openapi.json").json()
    operation = schema["paths"]["/v1/query"]["post"]
    assert {"400", "409", "413", "422", "503", "504"} <= set(operation["responses"])
    assert "QueryRequest" in schema["components"]["schemas"]
    # every reference resolves within the document (a dangling one breaks client generators)
    for ref in re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(schema)):
        assert ref in schema["components"]["schemas"], ref
    assert client.get("/docs").status_code == 200
    # one operationId per operation, also where one route serves two methods (/admin/faults)
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values() if "operationId" in op]
    assert len(ids) == len(set(ids))
    faults = schema["paths"]["/admin/faults"]
    assert faults["get"]["operationId"] == "faults_all_admin_faults_get"
    assert faults["delete"]["operationId"] == "faults_all_admin_faults_delete"


def test_the_schema_allows_a_fusion_field_exactly_where_the_gateway_takes_it(client):
    # the rules schemathesis relies on ("what the schema allows is accepted"), checked case by case
    validator = query_request_validator(client)
    bodies = [
        {"vector": GOOD}, {"vector": GOOD, "fusion": "rrf"}, {"vector": GOOD, "weights": None},
        {"vector": GOOD, "rrf_k": 60}, {"text": "x", "mode": "lexical", "candidates": 5},
        {"text": "x", "mode": "lexical"},
        *({"text": "x", "vector": GOOD, "mode": "hybrid", **extra} for extra in (
            {}, {"fusion": "rrf", "rrf_k": 5}, {"fusion": "rrf", "weights": {"dense": 1.0}}, {"rrf_k": 5},
            {"weights": {"dense": 1.0}}, {"weights": {"dense": 0, "lexical": 0}}, {"weights": {"dense": 0}},
            {"candidates": 30}, {"fusion": "weighted", "rrf_k": 5})),
    ]
    verdicts = []
    for body in bodies:
        status = client.post("/v1/query", json=body).status_code
        assert status in (200, 422), (body, status)
        verdicts.append((validator.is_valid(body), status == 200))
        assert verdicts[-1][0] == verdicts[-1][1], (body, status)
    assert {allowed for allowed, _ in verdicts} == {True, False}


def test_unknown_route_and_method_are_json_4xx(client):
    assert client.get("/v1/nope").status_code == 404
    response = client.get("/v1/query")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


def test_cluster_health_and_metrics(client):
    assert client.post("/v1/query", json={"vector": GOOD, "k": 0}).status_code == 422  # one refusal to count
    cluster = client.get("/v1/cluster").json()
    assert cluster["num_shards"] == 2 and all(s["healthy_replicas"] == 1 for s in cluster["shards"])
    assert client.get("/healthz").json()["status"] == "ok"
    metrics = client.get("/metrics").text
    assert "shardrag_gateway_query_latency_seconds" in metrics
    assert 'shardrag_gateway_requests_total{endpoint="query",status="422"}' in metrics


def test_filters_and_metadata(client):
    documents, vectors, _ = random_corpus(dim=DIM)
    by_id = {d.doc_id: d for d in documents}
    wanted = {"must": [{"key": "i", "range": {"gte": 100, "lt": 200}}]}
    response = client.post("/v1/query", json={"vector": vectors[150].tolist(), "k": 5, "filter": wanted,
                                              "with_metadata": True})
    hits = response.json()["hits"]
    assert response.status_code == 200 and len(hits) == 5 and hits[0]["doc_id"] == "doc-150"
    assert all(100 <= h["metadata"]["i"] < 200 and h["metadata"] == by_id[h["doc_id"]].metadata for h in hits)
    outside = client.post("/v1/query", json={"vector": vectors[5].tolist(), "k": 5, "filter": wanted}).json()["hits"]
    assert "doc-5" not in [h["doc_id"] for h in outside] and "metadata" not in outside[0]
    none = client.post("/v1/query", json={"vector": GOOD, "filter": {"must": [{"has_id": ["nope"]}]}})
    assert none.status_code == 200 and none.json()["hits"] == []


def test_vector_results_are_sane(client):
    documents, vectors, _ = random_corpus(dim=DIM)
    response = client.post("/v1/query", json={"vector": vectors[5].tolist(), "k": 4, "with_text": False})
    hits = response.json()["hits"]
    assert hits[0]["doc_id"] == documents[5].doc_id and hits[0]["text"] == ""
    assert np.isclose(hits[0]["score"], 1.0, atol=1e-5)


def test_the_status_page_is_html_and_the_cluster_view_has_balancer_state(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert b"replica-grid" in page.content and b"/v1/cluster" in page.content
    cluster = client.get("/v1/cluster").json()
    replica = cluster["shards"][0]["replicas"][0]
    assert "outstanding" in replica and "ewma_ms" in replica
    assert cluster["generators"] is None  # no generators configured


@pytest.mark.parametrize("path, field", [("/admin/faults/9/0", "shard"), ("/admin/faults/0/5", "replica"),
                                         ("/admin/faults/x/0", "shard")])
def test_fault_commands_name_a_shard_or_replica_that_does_not_exist(client, path, field):
    response = client.put(path, json={"spec": "latency=fixed:1"})
    assert 400 <= response.status_code < 500 and response.json()["error"]["field"] == field


@pytest.mark.parametrize("body, field", [
    ({"dim": 8, "quotas": {"max_rps": False}}, "quotas.max_rps"),  # lax mode took false as a rate of 0
    ({"dim": 8, "quotas": {"max_rps": "5"}}, "quotas.max_rps"),
    ({"dim": 8, "quotas": {"max_documents": True}}, "quotas.max_documents"),
    ({"dim": 8, "quotas": {"max_documents": 2.5}}, "quotas.max_documents"),
    ({"dim": True}, "dim"),
    ({"dim": "8"}, "dim"),
    ({"dim": 8, "shards": "2"}, "shards"),
    ({"dim": 8, "replicas": False}, "replicas"),
    ({"dim": 8, "factory": "HNSW32", "ef_construction": True}, "ef_construction"),
    ({"dim": 8, "metric": 1}, "metric"),
])
def test_a_collection_body_of_the_wrong_json_type_is_refused_naming_the_field(client, body, field):
    response = client.put("/v1/collections/typed", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert client.get("/v1/collections/typed").status_code == 404  # nothing was created


def test_a_collection_body_takes_json_integers_written_with_a_fraction_of_zero():
    # JSON has one number type and JSON Schema counts 3.0 as an integer: strict typing must not refuse it
    from serving.gateway.collection_models import CollectionCreate
    body = CollectionCreate.model_validate_json('{"dim": 8.0, "shards": 2.0, "quotas": {"max_documents": 5.0, '
                                                '"max_rps": 3}}')
    assert (body.dim, body.shards, body.quotas.max_documents, body.quotas.max_rps) == (8, 2, 5, 3.0)
    assert isinstance(body.dim, int) and isinstance(body.quotas.max_rps, float)


@pytest.mark.parametrize("path", ["/v1/answer", "/v1/collections/c/answer"])
def test_answers_without_generators_are_a_404_saying_how_to_start_them(client, path):
    response = client.post(path, json={"question": "why?"})
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "not_found" and error["field"] == "question" and "--generators" in error["message"]
    assert path.replace("/c/", "/{name}/") not in client.get("/openapi.json").json()["paths"]  # not offered
