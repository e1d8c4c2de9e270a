"""Haystack's filter syntax translated to shardrag's means what Haystack itself says it means:
random filters over random documents, judged by Haystack's own ``document_matches_filter`` (the
in-memory store's semantics) and by shardrag's ``Filter.matches`` on the translation."""

from __future__ import annotations

import random

import pytest
from haystack.dataclasses import Document
from haystack.errors import FilterError
from haystack.utils.filters import document_matches_filter

from integrations.haystack.filters import to_shardrag
from retrieval.filters import parse_filter

NUMBERS = [-10, -2, 0, 2, 5, 100]
WORDS = ["intro", "abstract", "conclusion"]
DATES = ["1969-07-21T20:17:40", "1972-12-11T19:54:58", "1989-11-09T17:53:00"]


def documents(rng: random.Random) -> list[Document]:
    docs = []
    for i in range(60):
        meta = {}
        if rng.random() < 0.7:
            meta["number"] = rng.choice(NUMBERS)
        if rng.random() < 0.7:
            meta["chapter"] = rng.choice(WORDS)
        if rng.random() < 0.7:
            meta["date"] = rng.choice(DATES)
        if rng.random() < 0.3:
            meta["flag"] = rng.random() < 0.5
        docs.append(Document(id=f"d{i}", content=f"doc {i}", meta=meta))
    return docs


def comparison(rng: random.Random) -> dict:
    field = rng.choice(["number", "chapter", "date", "flag", "missing"])
    operator = rng.choice(["==", "!=", ">", ">=", "<", "<=", "in", "not in"])
    if field == "flag" and operator in (">", ">=", "<", "<="):
        field = "number"  # Python orders True above 0; shardrag's ranges never hold on booleans (docs)
    pool = {"number": NUMBERS, "chapter": WORDS, "date": DATES, "flag": [True, False], "missing": NUMBERS}[field]
    if operator in ("in", "not in"):
        value = rng.sample(pool, k=min(len(pool), rng.randint(1, 3))) + ([None] if rng.random() < 0.2 else [])
    elif operator in (">", ">=", "<", "<="):
        value = rng.choice(NUMBERS + DATES + [None]) if field != "chapter" else rng.choice(DATES + [None])
    else:
        value = rng.choice(pool + [None])
    return {"field": f"meta.{field}" if rng.random() < 0.8 else field, "operator": operator, "value": value}


def node(rng: random.Random, depth: int) -> dict:
    if depth == 0 or rng.random() < 0.4:
        return comparison(rng)
    return {"operator": rng.choice(["AND", "OR", "NOT"]),
            "conditions": [node(rng, depth - 1) for _ in range(rng.randint(1, 3))]}


def haystack_says(filters: dict, doc: Document) -> bool | None:
    """Haystack's verdict; None where it raises for this document (comparing a number with a date)."""
    try:
        return document_matches_filter(filters, doc)
    except FilterError:
        return None


@pytest.mark.parametrize("seed", range(4))
def test_translated_filters_select_what_haystack_selects(seed):
    rng = random.Random(seed)
    docs = documents(rng)
    checked = 0
    for _ in range(400):
        filters = node(rng, 3)  # three logical levels under the top one
        if "conditions" not in filters:
            filters = {"operator": "AND", "conditions": [filters]}
        verdicts = [haystack_says(filters, d) for d in docs]
        if None in verdicts:
            continue  # Haystack itself refuses these documents: nothing to agree with
        try:
            translated = parse_filter(to_shardrag(filters))
        except FilterError:
            continue  # refused up front (a non-date string with >): Haystack raises for it too, on some store
        ours = [translated.matches(d.id, {k: v for k, v in d.meta.items()}) for d in docs]
        assert ours == verdicts, filters
        checked += 1
    assert checked > 150


@pytest.mark.parametrize("filters", [
    {"conditions": [{"field": "meta.a", "operator": "==", "value": 1}]},
    {"operator": "AND"},
    {"operator": "AND", "conditions": [{"operator": "==", "value": 1}]},
    {"operator": "AND", "conditions": [{"field": "meta.a", "value": 1}]},
    {"operator": "AND", "conditions": [{"field": "meta.a", "operator": "=="}]},
    {"field": "meta.a", "operator": ">", "value": "1"},
    {"field": "meta.a", "operator": ">", "value": [1]},
    {"field": "meta.a", "operator": "in", "value": 9},
    {"field": "meta.a", "operator": "in", "value": (1, 2)},
    {"field": "meta.a", "operator": "~", "value": 1},
    {"field": "content", "operator": "==", "value": "x"},
    {"operator": "XOR", "conditions": []},
])
def test_malformed_or_impossible_filters_raise_filter_error(filters):
    with pytest.raises(FilterError):
        to_shardrag(filters)


def test_ids_and_the_constants():
    assert to_shardrag(None) == {} and to_shardrag({}) == {}
    assert to_shardrag({"field": "id", "operator": "in", "value": ["a", "b"]}) == {"must": [{"has_id": ["a", "b"]}]}
    assert parse_filter(to_shardrag({"field": "meta.n", "operator": ">", "value": None})).matches("x", {"n": 1}) \
        is False
    assert to_shardrag({"operator": "NOT", "conditions": [{"field": "meta.n", "operator": "<", "value": None}]}) == {}


def test_an_id_list_longer_than_a_has_id_holds():
    ids = [f"d{i}" for i in range(2_500)]
    for operator, inside in (("in", True), ("not in", False)):
        parsed = parse_filter(to_shardrag({"field": "id", "operator": operator, "value": ids}))
        assert parsed.matches("d0", {}) is inside and parsed.matches("d2499", {}) is inside
        assert parsed.matches("d2500", {}) is not inside
    with pytest.raises(FilterError, match="'in' on id: a filter names at most 16,000 ids"):
        to_shardrag({"field": "id", "operator": "in", "value": [f"d{i}" for i in range(16_001)]})
