"""A LangChain ``filter=`` in shardrag's filter language (docs/filters.md).

Three forms are taken, so that code written for another LangChain vector store keeps working:

| given | shardrag |
|---|---|
| a shardrag filter (top-level ``must`` / ``should`` / ``must_not``) | as it is |
| ``{key: value}`` (a list value: any of them); several keys | ``match``; all of them in ``must`` |
| ``{key: {"$eq": v}}``, ``$ne`` | ``match`` / ``must_not`` it (a document without the key is ``$ne``) |
| ``$gt``, ``$gte``, ``$lt``, ``$lte`` (numbers or ISO 8601 date-times) | one ``range`` per key |
| ``$in`` / ``$nin`` (a list) | ``match.any`` / ``must_not`` it (``$in: []`` selects nothing) |
| ``$exists`` (a boolean) | ``must_not is_empty`` / ``is_empty`` |
| ``{"$and": [...]}``, ``{"$or": [...]}``, ``{"$not": {...}}`` | ``must`` / ``should`` / ``must_not`` |

The operator form is the one Chroma, PGVector, Pinecone and MongoDB Atlas stores take (MongoDB's
query operators); ``$ne`` and ``$nin`` select a document without the key, as in MongoDB. Anything
else — another ``$`` operator, a mapping where a value belongs (metadata is flat) — raises a
``ValueError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from integrations.lists import any_condition
from retrieval.datetimes import instant

CLAUSES = ("must", "should", "must_not")
NOTHING: dict[str, Any] = {"must_not": [{}]}  # no document passes ({} passes every one)
_RANGES = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
_OPERATORS = ("$eq", "$ne", *_RANGES, "$in", "$nin", "$exists")


def to_shardrag(given: Mapping[str, Any]) -> dict[str, Any]:
    """The shardrag filter that selects what ``given`` selects ({}: every document)."""
    if not isinstance(given, Mapping):
        raise ValueError(f"filter must be a mapping, got {type(given).__name__}")
    if not given or any(clause in given for clause in CLAUSES):
        return dict(given)
    return {"must": _conditions(given)}


def _conditions(given: Mapping[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for key, value in given.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value or not all(isinstance(v, Mapping) and v for v in value):
                raise ValueError(f"filter {key} takes a non-empty list of filters, got {value!r}")
            if key == "$and":  # its conditions join the ones around it (filters nest at most 4 deep)
                found.extend(condition for part in value for condition in _conditions(part))
            else:
                found.append({"should": [_one(_conditions(part)) for part in value]})
        elif key == "$not":
            if not isinstance(value, Mapping) or not value:
                raise ValueError(f"filter $not takes a filter, got {value!r}")
            found.append({"must_not": [_one(_conditions(value))]})
        elif key.startswith("$"):
            raise ValueError(f"filter: unknown operator {key!r} at the top (use $and, $or, $not, or a metadata key)")
        elif isinstance(value, Mapping):
            found.extend(_operators(key, value))
        elif isinstance(value, list | tuple):
            found.append(any_condition(key, value) if value else NOTHING)
        else:
            found.append({"key": key, "match": {"value": value}})
    return found


def _one(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    """All of ``conditions`` as one condition (a lone one as it is: a level less of nesting)."""
    return conditions[0] if len(conditions) == 1 else {"must": conditions}


def _operators(key: str, given: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The conditions of ``{key: {"$op": value, ...}}``: all of them hold."""
    unknown = [op for op in given if op not in _OPERATORS]
    if unknown or not given:
        raise ValueError(f"filter on {key!r}: {'unknown operator ' + repr(unknown[0]) if unknown else 'no operator'}"
                         f"; use {', '.join(_OPERATORS)} (metadata is flat: a mapping is not a value)")
    found: list[dict[str, Any]] = []
    bounds: dict[str, Any] = {}
    for op, value in given.items():
        if op in _RANGES:
            if isinstance(value, bool) or not (isinstance(value, int | float) or
                                               (isinstance(value, str) and instant(value) is not None)):
                raise ValueError(f"filter on {key!r}: {op} compares numbers or ISO 8601 date-times, got {value!r}")
            bounds[_RANGES[op]] = value
        elif op in ("$in", "$nin"):
            if not isinstance(value, list | tuple):
                raise ValueError(f"filter on {key!r}: {op} takes a list, got {value!r}")
            chosen = any_condition(key, value) if value else NOTHING
            found.append(chosen if op == "$in" else {"must_not": [chosen]})
        elif op == "$exists":
            if not isinstance(value, bool):
                raise ValueError(f"filter on {key!r}: $exists takes true or false, got {value!r}")
            empty = {"is_empty": {"key": key}}
            found.append({"must_not": [empty]} if value else empty)
        else:  # $eq, $ne
            if isinstance(value, Mapping | list | tuple) or value is None:
                raise ValueError(f"filter on {key!r}: {op} compares with one value, got {value!r}")
            match = {"key": key, "match": {"value": value}}
            found.append(match if op == "$eq" else {"must_not": [match]})
    if bounds:
        found.append({"key": key, "range": bounds})
    return found
