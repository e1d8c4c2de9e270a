"""LangChain filters — shardrag's own, ``{key: value}`` pairs and the MongoDB-style operators other
LangChain stores take — translated to shardrag's language mean what MongoDB's operators mean on
flat metadata: random filters over random documents, judged by a reference written from those
semantics and by shardrag's ``Filter.matches`` on the translation."""

from __future__ import annotations

import random
from typing import Any

import pytest

from integrations.langchain.filters import to_shardrag
from retrieval.datetimes import instant
from retrieval.errors import InvalidRequest
from retrieval.filters import parse_filter

NUMBERS = [-3, 0, 2, 2.5, 10]
WORDS = ["geo", "bio", "chem"]
DATES = ["2024-01-31T12:00:00Z", "2024-02-01T00:30:00+01:00", "2025-06-01"]


def documents(rng: random.Random) -> list[dict[str, Any]]:
    docs = []
    for _ in range(50):
        meta: dict[str, Any] = {}
        if rng.random() < 0.7:
            meta["n"] = rng.choice(NUMBERS + [True])
        if rng.random() < 0.7:
            meta["kind"] = rng.choice([*WORDS, [], rng.sample(WORDS, 2)])
        if rng.random() < 0.7:
            meta["when"] = rng.choice(DATES)
        docs.append(meta)
    return docs


def same(a: Any, b: Any) -> bool:
    """Equal as shardrag compares: a boolean is never a number."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def equals(value: Any, wanted: Any) -> bool:
    return any(same(v, wanted) for v in value) if isinstance(value, list) else value is not None and same(value,
                                                                                                       wanted)


def compares(value: Any, op: str, bound: Any) -> bool:
    if isinstance(bound, str):
        if not isinstance(value, str) or instant(value) is None:
            return False
        value, bound = instant(value), instant(bound)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return {"$gt": value > bound, "$gte": value >= bound, "$lt": value < bound, "$lte": value <= bound}[op]


def holds(held: Any, op: str, operand: Any) -> bool:
    """One MongoDB operator on the key's value (None: absent)."""
    if op in ("$eq", "$ne"):
        return equals(held, operand) == (op == "$eq")
    if op in ("$in", "$nin"):
        return any(equals(held, v) for v in operand) == (op == "$in")
    if op == "$exists":
        return (held is not None and held != []) == operand
    return compares(held, op, operand)


def reference(given: dict[str, Any], meta: dict[str, Any]) -> bool:
    """MongoDB's meaning of the filter on a flat document."""
    for key, value in given.items():
        if key == "$and" and not all(reference(f, meta) for f in value):
            return False
        if key == "$or" and not any(reference(f, meta) for f in value):
            return False
        if key == "$not" and reference(value, meta):
            return False
        if key.startswith("$"):
            continue
        held = meta.get(key)
        if isinstance(value, dict):
            if not all(holds(held, op, operand) for op, operand in value.items()):
                return False
        elif isinstance(value, list):
            if not any(equals(held, v) for v in value):
                return False
        elif not equals(held, value):
            return False
    return True


def random_filter(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    if depth < 2 and rng.random() < 0.35:
        group = rng.choice(["$and", "$or", "$not"])
        if group == "$not":
            return {"$not": random_filter(rng, depth + 1)}
        return {group: [random_filter(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    key = rng.choice(["n", "kind", "when"])
    pool = {"n": NUMBERS + [True], "kind": WORDS, "when": DATES}[key]
    shape = rng.choice(["plain", "list", "ops"])
    if shape == "plain":
        return {key: rng.choice(pool)}
    if shape == "list":
        return {key: rng.sample(pool, rng.randint(1, 2))}
    ops: dict[str, Any] = {}
    for op in rng.sample(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists"], rng.randint(1, 2)):
        if op in ("$in", "$nin"):
            ops[op] = rng.sample(pool, rng.randint(0, 2))
        elif op == "$exists":
            ops[op] = rng.random() < 0.5
        elif op in ("$eq", "$ne"):
            ops[op] = rng.choice(pool)
        else:
            ops[op] = rng.choice(DATES if key == "when" else [n for n in NUMBERS])
    return {key: ops}


@pytest.mark.parametrize("seed", range(6))
def test_translated_filters_select_what_mongodb_operators_select(seed):
    rng = random.Random(seed)
    docs = documents(rng)
    judged = 0
    for _ in range(60):
        given = random_filter(rng)
        try:
            parsed = parse_filter(to_shardrag(given))
        except InvalidRequest as exc:  # the API's limit, which the gateway would answer with a 422 naming it
            assert "filters nest at most 4 levels deep" in exc.message
            continue
        judged += 1
        for meta in docs:
            assert parsed.matches("id", meta) == reference(given, meta), (given, meta)
    assert judged >= 50


def test_shardrag_filters_and_plain_pairs_pass_as_they_were():
    native = {"must_not": [{"key": "kind", "match": {"value": "geo"}}]}
    assert to_shardrag(native) == native and to_shardrag({}) == {}
    assert to_shardrag({"kind": "geo", "tag": ["a", "b"]}) == {"must": [{"key": "kind", "match": {"value": "geo"}},
                                                                        {"key": "tag", "match": {"any": ["a", "b"]}}]}
    assert to_shardrag({"year": {"$gte": 2020, "$lt": 2024}}) == {"must": [{"key": "year",
                                                                           "range": {"gte": 2020, "lt": 2024}}]}


@pytest.mark.parametrize("given, message", [
    ({"year": {"$regex": "^19"}}, "filter on 'year': unknown operator '\\$regex'"),
    ({"year": {}}, "filter on 'year': no operator"),
    ({"year": {"$gt": "soon"}}, "\\$gt compares numbers or ISO 8601 date-times"),
    ({"year": {"$in": 2020}}, "\\$in takes a list"),
    ({"year": {"$exists": 1}}, "\\$exists takes true or false"),
    ({"year": {"$eq": [1]}}, "\\$eq compares with one value"),
    ({"$and": []}, "\\$and takes a non-empty list of filters"),
    ({"$nor": [{"a": 1}]}, "unknown operator '\\$nor' at the top"),
    (["a"], "filter must be a mapping"),
])
def test_what_cannot_be_translated_is_refused_naming_it(given, message):
    with pytest.raises(ValueError, match=message):
        to_shardrag(given)
