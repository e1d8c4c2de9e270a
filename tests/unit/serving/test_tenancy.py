"""Tenant confinement as pure functions: the mandatory filter, ids in the tenant's namespace."""

from __future__ import annotations

import pytest

from retrieval.errors import Forbidden, InvalidRequest
from retrieval.filters import parse_filter
from serving.gateway.tenancy import (
    confine_delete,
    confine_filter,
    confine_hits,
    confine_ids,
    confine_upsert,
    shown_id,
    stored_id,
)
from serving.writes.models import DeleteRequest, UpsertRequest


def test_the_tenant_clause_is_anded_with_whatever_the_caller_sends():
    hostile = {"should": [{"key": "tenant", "match": {"value": "globex"}}], "must": [{"has_id": ["a", "b"]}]}
    confined = confine_filter(hostile, "tenant", "acme")
    assert confined["must"][0] == {"key": "tenant", "match": {"value": "acme"}}
    assert confined["must"][1]["must"][0]["has_id"] == ["acme::a", "acme::b"]
    parsed = parse_filter(confined)
    assert not parsed.matches("acme::a", {"tenant": "globex"})
    assert parsed.matches("acme::a", {"tenant": "acme"}) is False  # the should clause still has to hold
    assert confine_filter(None, "tenant", "acme") == {"must": [{"key": "tenant", "match": {"value": "acme"}}]}


def test_a_tenant_key_writes_into_its_namespace_only():
    request = UpsertRequest(documents=[{"id": "d1", "vector": [1.0]}, {"id": "d2", "vector": [1.0],
                                                                      "metadata": {"tenant": "acme", "x": 1}}])
    confined = confine_upsert(request, "tenant", "acme")
    assert [d.id for d in confined.documents] == ["acme::d1", "acme::d2"]
    assert [d.metadata["tenant"] for d in confined.documents] == ["acme", "acme"]
    assert confined.documents[1].metadata["x"] == 1
    other = UpsertRequest(documents=[{"id": "d1", "vector": [1.0], "metadata": {"tenant": "globex"}}])
    with pytest.raises(Forbidden) as refused:
        confine_upsert(other, "tenant", "acme")
    assert refused.value.field == "documents.0.metadata.tenant"


def test_an_unscoped_key_names_the_tenant_of_every_document():
    by_field = confine_upsert(UpsertRequest(documents=[{"id": "d", "vector": [1.0], "metadata": {"tenant": "a"}}]),
                              "tenant", None)
    assert by_field.documents[0].id == "a::d"
    by_prefix = confine_upsert(UpsertRequest(documents=[{"id": "b::d", "vector": [1.0]}]), "tenant", None)
    assert by_prefix.documents[0].id == "b::d" and by_prefix.documents[0].metadata["tenant"] == "b"
    with pytest.raises(InvalidRequest) as missing:
        confine_upsert(UpsertRequest(documents=[{"id": "d", "vector": [1.0]}]), "tenant", None)
    assert missing.value.field == "documents.0.metadata.tenant"
    with pytest.raises(InvalidRequest):
        confine_upsert(UpsertRequest(documents=[{"id": "b::d", "vector": [1.0], "metadata": {"tenant": "a"}}]),
                       "tenant", None)


def test_deletes_and_answers_stay_in_the_namespace():
    assert confine_delete(DeleteRequest(ids=["x", "globex::y"]), "tenant", "acme").ids == ["acme::x",
                                                                                          "acme::globex::y"]
    by_filter = confine_delete(DeleteRequest(filter={"must_not": [{"key": "tenant", "match": {"value": "acme"}}]}),
                               "tenant", "acme")
    assert by_filter.filter["must"][0] == {"key": "tenant", "match": {"value": "acme"}}
    answer = {"hits": [{"doc_id": "acme::a", "score": 1.0}, {"doc_id": "globex::b", "score": 0.9}], "partial": False}
    assert confine_hits(answer, "acme") == {"hits": [{"doc_id": "a", "score": 1.0}], "partial": False}
    assert confine_ids({"ids": ["acme::a"], "seq": {}}, "acme") == {"ids": ["a"], "seq": {}}
    assert shown_id("acme", stored_id("acme", "q")) == "q" and shown_id("acme", "globex::q") == "globex::q"
    with pytest.raises(InvalidRequest):
        stored_id("acme", "x" * 512)


@pytest.mark.parametrize("blank", [" ", "\x1e", "\ufeff"])
def test_a_blank_id_is_refused_in_a_tenants_namespace_as_it_is_outside_one(blank):
    # the prefix would make "acme:: " look named; the write service would take it
    with pytest.raises(InvalidRequest) as scoped:
        confine_upsert(UpsertRequest(documents=[{"id": "ok", "vector": [1.0]}, {"id": blank, "vector": [1.0]}]),
                       "tenant", "acme")
    assert scoped.value.field == "documents.1.id"
    with pytest.raises(InvalidRequest) as unscoped:
        confine_upsert(UpsertRequest(documents=[{"id": f"acme::{blank}", "vector": [1.0]}]), "tenant", None)
    assert unscoped.value.field == "documents.0.id"
    with pytest.raises(InvalidRequest) as deleted:
        confine_delete(DeleteRequest(ids=["x", blank]), "tenant", "acme")
    assert deleted.value.field == "ids[1]"
    with pytest.raises(InvalidRequest) as read:
        stored_id("acme", blank)
    assert read.value.field == "id"
    # where an id only matches (a filter's has_id), a blank one matches nothing and is let through
    assert confine_filter({"must": [{"has_id": [blank]}]}, "tenant", "acme")["must"][1]["must"][0]["has_id"] == [
        f"acme::{blank}"]
