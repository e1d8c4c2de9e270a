"""A collection's query defaults (retrieval.query_defaults): what a query naming no mode, fusion,
weights or rrf_k is searched with — read from the gateway config for the collection it was
started with (here, over real FAISS shards in process), from the spec for a created one
(tests/integration/test_query_defaults.py)."""

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from clusterstate.collections import CollectionSpec
from retrieval.errors import ConfigError, InvalidRequest
from retrieval.query_defaults import PLAIN, QueryDefaults
from serving.answer.service import AnswerRequest, retrieval_query
from serving.gateway.api_models import QueryRequest
from serving.gateway.config import GatewayConfig
from serving.gateway.query import check_fusion_fields, with_query_defaults
from tests.conftest import random_corpus
from tests.unit.serving.gateway_harness import build, gateway_client

DIM = 32
HYBRID = QueryDefaults("hybrid", "weighted", {"dense": 0.9, "lexical": 0.1})


@pytest.mark.parametrize("data, field", [
    ({"mode": "sparse"}, "query_defaults.mode"),
    ({"fusion": "max"}, "query_defaults.fusion"),
    ({"rrf_k": -1}, "query_defaults.rrf_k"),
    ({"rrf_k": True}, "query_defaults.rrf_k"),
    ({"weights": {"dense": 0, "lexical": 0}}, "query_defaults.weights"),
    ({"weights": {"dense": "1"}}, "query_defaults.weights.dense"),
    ({"weights": {"dense": 1, "sparse": 1}}, "query_defaults.weights"),
    ({"weights": {"lexical": 2000}}, "query_defaults.weights.lexical"),
    ({"mode": "hybrid", "alpha": 0.5}, "query_defaults.alpha"),
    ("hybrid", "query_defaults"),
])
def test_bad_defaults_are_refused_naming_the_field(data, field):
    with pytest.raises(ConfigError) as raised:
        QueryDefaults.from_dict(data)
    assert raised.value.field == field


def test_defaults_travel_in_the_collection_spec_and_old_specs_read_plain():
    spec = CollectionSpec("docs", dim=8, query_defaults=HYBRID)
    again = CollectionSpec.from_dict(spec.to_dict())
    assert again.query_defaults == HYBRID and again == spec
    assert again.to_dict()["query_defaults"] == {"mode": "hybrid", "fusion": "weighted",
                                                 "weights": {"dense": 0.9, "lexical": 0.1}, "rrf_k": 60}
    old = spec.to_dict()
    del old["query_defaults"]  # a spec recorded before query defaults existed
    assert CollectionSpec.from_dict(old).query_defaults.is_plain
    assert QueryDefaults.from_dict({"mode": "dense"}).is_plain and not HYBRID.is_plain


def test_the_gateway_config_has_a_query_defaults_section():
    config = GatewayConfig.from_dict({"query_defaults": {"mode": "hybrid", "fusion": "rrf", "rrf_k": 20}})
    assert config.query_defaults == QueryDefaults("hybrid", "rrf", None, 20)
    assert GatewayConfig.from_dict({}).query_defaults == PLAIN
    with pytest.raises(ConfigError) as raised:
        GatewayConfig.from_dict({"query_defaults": {"weights": {"dense": -1, "lexical": 1}}})
    assert raised.value.field == "query_defaults.weights.dense"
    with pytest.raises(ConfigError) as raised:
        GatewayConfig.from_dict({"query_defaults": {"modes": "hybrid"}})
    assert raised.value.field == "query_defaults.modes"


def resolved(body: dict, defaults: QueryDefaults) -> tuple[QueryRequest, list[str]]:
    request = QueryRequest.model_validate(body)
    given = set(request.model_fields_set)
    searched, defaulted = with_query_defaults(request, defaults)
    check_fusion_fields(searched, given)
    return searched, defaulted


def test_a_querys_own_fields_win_and_the_rest_come_from_the_defaults():
    searched, defaulted = resolved({"text": "fjords"}, HYBRID)
    assert (searched.mode, searched.fusion, searched.weights.dense, searched.weights.lexical) == \
        ("hybrid", "weighted", 0.9, 0.1)
    assert defaulted == ["mode", "weights"]
    searched, defaulted = resolved({"text": "fjords", "mode": "dense"}, HYBRID)
    assert (searched.mode, defaulted) == ("dense", [])
    # weights named without a mode: the default mode makes them count
    searched, defaulted = resolved({"text": "fjords", "weights": {"dense": 0.5, "lexical": 0.5}}, HYBRID)
    assert (searched.mode, searched.weights.dense, defaulted) == ("hybrid", 0.5, ["mode"])
    # a vector and no text stays dense: a lexical leg needs text
    searched, defaulted = resolved({"vector": [0.1] * 4}, HYBRID)
    assert (searched.mode, defaulted) == ("dense", [])
    rrf = QueryDefaults("hybrid", "rrf", None, 20)
    searched, defaulted = resolved({"text": "fjords"}, rrf)
    assert (searched.fusion, searched.rrf_k, searched.weights, defaulted) == ("rrf", 20, None, ["mode", "fusion",
                                                                                                 "rrf_k"])
    searched, defaulted = resolved({"text": "fjords", "fusion": "weighted"}, rrf)
    assert (searched.fusion, searched.weights, defaulted) == ("weighted", None, ["mode"])  # msmarco's weights
    # weights under an rrf default are refused as they are for an rrf query: named, not dropped
    with pytest.raises(InvalidRequest) as raised:
        resolved({"text": "fjords", "weights": {"dense": 1, "lexical": 1}}, rrf)
    assert raised.value.field == "weights"
    # an answer naming a fusion and no mode: hybrid under a hybrid default, refused under a dense one
    body = retrieval_query(AnswerRequest(question="why?", fusion="rrf"))
    assert resolved(body, HYBRID)[0].fusion == "rrf"
    with pytest.raises(InvalidRequest) as raised:
        resolved(body, PLAIN)
    assert raised.value.field == "fusion"
    # a dense default leaves fusion fields as refused as before
    with pytest.raises(InvalidRequest) as raised:
        resolved({"text": "fjords", "rrf_k": 5}, PLAIN)
    assert raised.value.field == "rrf_k"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    documents, vectors, version = random_corpus(dim=DIM)
    return build(tmp_path_factory.mktemp("defaults"), "c", documents, vectors, version, 2, "hash")


def test_the_started_with_collection_takes_its_defaults_from_the_gateway_config(shards):
    config = GatewayConfig.from_dict({"encoder": {"load": False}, "query_defaults": {"mode": "lexical"}})
    with gateway_client(shards, config) as client:
        reply = client.post("/v1/query", json={"text": "document 17", "k": 3})
        assert reply.status_code == 200, reply.text
        diagnostics = reply.json()["diagnostics"]
        assert (diagnostics["mode"], diagnostics["defaulted"]) == ("lexical", ["mode"])
        explicit = client.post("/v1/query", json={"text": "document 17", "k": 3, "mode": "lexical"}).json()
        assert [h["doc_id"] for h in reply.json()["hits"]] == [h["doc_id"] for h in explicit["hits"]]
        assert explicit["diagnostics"]["defaulted"] == []
        vector = client.post("/v1/query", json={"vector": [0.1] * DIM, "k": 3}).json()["diagnostics"]
        assert (vector["mode"], vector["defaulted"]) == ("dense", [])
        # no encoder here: a text query that asks for dense itself still needs one
        assert client.post("/v1/query", json={"text": "x", "mode": "dense"}).status_code == 503
        shown = client.get("/v1/collections/c").json()
        assert shown["query_defaults"] == {"mode": "lexical", "fusion": "weighted", "weights": None, "rrf_k": 60}
        refused = client.put("/v1/collections/c/query-defaults", json={"mode": "hybrid"})
        assert refused.status_code == 409 and refused.json()["error"]["field"] == "name"
    with gateway_client(shards, GatewayConfig.from_dict({"encoder": {"load": False}})) as client:
        plain = client.post("/v1/query", json={"text": "document 17", "vector": [0.1] * DIM})
        assert plain.status_code == 422  # dense takes one of text and vector: nothing changed without defaults
    hybrid = {"encoder": {"load": False}, "query_defaults": {"mode": "hybrid", "fusion": "rrf", "rrf_k": 5}}
    with gateway_client(shards, GatewayConfig.from_dict(hybrid)) as client:
        reply = client.post("/v1/query", json={"text": "document 17", "vector": [0.1] * DIM, "k": 3})
        assert reply.status_code == 200, reply.text
        assert reply.json()["diagnostics"]["fusion"].startswith("rrf k=5")
        assert all(set(hit["legs"]) <= {"dense", "lexical"} for hit in reply.json()["hits"])


def validator_of(schema: dict, name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {**schema["components"]["schemas"][name], "components": schema["components"]},
        registry=Registry().with_resource("", Resource.from_contents(schema, DRAFT202012)))


def test_the_schema_states_the_named_mode_rules_and_leaves_an_unnamed_mode_to_the_defaults(shards):
    good = [0.1] * DIM
    named = [{"vector": good, "mode": "dense"}, {"text": "x", "vector": good, "mode": "dense"},
             {"text": "x", "mode": "lexical"}, {"text": "x", "vector": good, "mode": "lexical"},
             {"text": "x", "mode": "lexical", "fusion": "rrf"}, {"vector": good, "mode": "hybrid"},
             *({"text": "x", "vector": good, "mode": "hybrid", **extra} for extra in (
                 {}, {"fusion": "rrf", "rrf_k": 5}, {"fusion": "rrf", "weights": {"dense": 1.0}},
                 {"fusion": "weighted", "rrf_k": 5}, {"weights": {"dense": 0.5}}))]
    config = GatewayConfig.from_dict({"encoder": {"load": False}, "query_defaults": {"mode": "lexical"}})
    with gateway_client(shards, config) as client:
        schema = client.get("/openapi.json").json()
        for name in ("QueryRequest", "CollectionQueryRequest"):
            validator = validator_of(schema, name)
            verdicts = set()
            for body in named:  # a named mode: what the schema allows is accepted, what it forbids refused
                status = client.post("/v1/query", json=body).status_code
                assert validator.is_valid(body) == (status == 200), (name, body, status)
                verdicts.add(status)
            assert verdicts == {200, 422}
            # a mode named by no field is the collection's: allowed by the schema, checked by the collection
            assert validator.is_valid({"text": "x", "vector": good}) and validator.is_valid({"text": "x"})
            assert not validator.is_valid({"k": 3})  # but never without a text or a vector
        assert client.post("/v1/query", json={"text": "x", "vector": good}).status_code == 422  # lexical: no vector
        # a collection's own dimension: any length is the schema's, the collection checks its own
        assert validator_of(schema, "CollectionQueryRequest").is_valid({"vector": [0.5] * (DIM + 3)})
        assert not validator_of(schema, "QueryRequest").is_valid({"vector": [0.5] * (DIM + 3)})
    with gateway_client(shards, GatewayConfig.from_dict({"encoder": {"load": False}})) as client:
        plain = validator_of(client.get("/openapi.json").json(), "QueryRequest")
        assert not plain.is_valid({"text": "x", "vector": good})  # plain: a query naming no mode is dense
