"""Haystack's filter syntax (``{"field", "operator", "value"}`` comparisons under ``AND`` / ``OR`` /
``NOT``) as shardrag's filter language (docs/filters.md), with the meaning Haystack's own
``InMemoryDocumentStore`` gives it:

| Haystack | shardrag |
|---|---|
| ``== v`` / ``!= v`` | ``match v`` / ``must_not`` it (a document without the field is ``!= v``) |
| ``== None`` / ``!= None`` | ``is_empty`` / ``must_not`` it |
| ``>``, ``>=``, ``<``, ``<=`` a number | a numeric ``range`` |
| … an ISO 8601 date-time string | a date-time ``range`` (compared as instants) |
| … ``None`` | matches nothing |
| ``in [..]`` / ``not in [..]`` | ``match any`` / ``must_not`` it (``None`` in the list: ``is_empty`` too) |
| ``AND`` / ``OR`` / ``NOT`` | ``must`` / ``should`` / ``must_not`` of the conditions' ``must`` |

``meta.x`` and ``x`` name the metadata key ``x``; ``id`` is the document id (``==``, ``!=``,
``in``, ``not in``). A malformed filter, a comparison shardrag cannot make (a string other than a
date-time with ``>``, a list where a value belongs, ``content``) raises Haystack's ``FilterError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from haystack.errors import FilterError

from integrations.lists import any_condition, ids_condition
from retrieval.datetimes import instant

NOTHING: dict[str, Any] = {"must_not": [{}]}  # a filter no document passes ({} passes every one)
EVERYTHING: dict[str, Any] = {}
LOGIC = ("AND", "OR", "NOT")
COMPARISONS = ("==", "!=", ">", ">=", "<", "<=", "in", "not in")
RANGES = {">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}


def to_shardrag(filters: Mapping[str, Any] | None) -> dict[str, Any]:
    """The shardrag filter of Haystack ``filters`` (None or {}: every document)."""
    if not filters:
        return {}
    if not isinstance(filters, Mapping):
        raise FilterError(f"filters must be a dictionary, got {type(filters).__name__}")
    return _as_filter(_node(filters))


def _node(node: Mapping[str, Any]) -> dict[str, Any]:
    """One Haystack node as a shardrag condition (a nested filter, a field condition, NOTHING or
    EVERYTHING)."""
    if not isinstance(node, Mapping):
        raise FilterError(f"a filter condition must be a dictionary, got {node!r}")
    if "operator" not in node:
        raise FilterError(f"a filter condition needs an 'operator': {dict(node)}")
    operator = node["operator"]
    if "conditions" in node or operator in LOGIC:
        if operator not in LOGIC:
            raise FilterError(f"unknown logical operator {operator!r}; use AND, OR or NOT")
        conditions = node.get("conditions")
        if not isinstance(conditions, list):
            raise FilterError(f"the {operator} condition needs a list of 'conditions': {dict(node)}")
        children = [_node(child) for child in conditions]
        if operator == "AND":
            return _all(children)
        if operator == "OR":
            return _any(children)
        return _negate(_all(children))
    if "field" not in node:
        raise FilterError(f"a comparison needs a 'field': {dict(node)}")
    if "value" not in node:
        raise FilterError(f"a comparison needs a 'value': {dict(node)}")
    if operator not in COMPARISONS:
        raise FilterError(f"unknown comparison operator {operator!r}; use one of {', '.join(COMPARISONS)}")
    return _comparison(str(node["field"]), operator, node["value"])


def _comparison(field: str, operator: str, value: Any) -> dict[str, Any]:
    if field == "id":
        return _id_comparison(operator, value)
    if field in ("content", "embedding", "score", "blob", "sparse_embedding"):
        raise FilterError(f"shardrag filters documents by id and metadata, not by {field!r}")
    key = field.removeprefix("meta.")
    if operator in ("==", "!="):
        if isinstance(value, (list, tuple, dict)):
            raise FilterError(f"'{operator}' compares with one value, got {value!r} for {field!r}")
        found = {"is_empty": {"key": key}} if value is None else {"key": key, "match": {"value": value}}
        return found if operator == "==" else _negate(found)
    if operator in RANGES:
        if value is None:
            return NOTHING  # None is neither greater nor smaller than anything
        if isinstance(value, (list, tuple, dict)) or isinstance(value, bool):
            raise FilterError(f"'{operator}' compares with a number or a date-time, got {value!r} for {field!r}")
        if isinstance(value, str) and instant(value) is None:
            raise FilterError(f"'{operator}' compares strings only when they are ISO 8601 date-times, got {value!r} "
                              f"for {field!r}")
        return {"key": key, "range": {RANGES[operator]: value}}
    if not isinstance(value, list):
        raise FilterError(f"'{operator}' takes a list, got {value!r} for {field!r}")
    values = [v for v in value if v is not None]
    if any(isinstance(v, (list, tuple, dict)) for v in values):
        raise FilterError(f"'{operator}' takes a list of values, got {value!r} for {field!r}")
    try:
        options = ([any_condition(key, values)] if values else []) + (
            [{"is_empty": {"key": key}}] if len(values) < len(value) else [])
    except ValueError as exc:
        raise FilterError(f"'{operator}' on {field!r}: {exc}") from None
    found = _any(options)
    return found if operator == "in" else _negate(found)


def _id_comparison(operator: str, value: Any) -> dict[str, Any]:
    if operator in ("==", "!="):
        if not isinstance(value, str):
            raise FilterError(f"an id is a string, got {value!r}")
        found = {"has_id": [value]} if value else NOTHING
    elif operator in ("in", "not in"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise FilterError(f"'{operator}' on id takes a list of strings, got {value!r}")
        ids = [v for v in value if v]
        try:
            found = ids_condition(ids) if ids else NOTHING
        except ValueError as exc:
            raise FilterError(f"'{operator}' on id: {exc}") from None
    else:
        raise FilterError(f"ids compare with ==, !=, in and not in, not {operator!r}")
    return found if operator in ("==", "in") else _negate(found)


def _is_filter(condition: Mapping[str, Any]) -> bool:
    return not condition or any(occur in condition for occur in ("must", "should", "must_not"))


def _all(children: list[dict[str, Any]]) -> dict[str, Any]:
    """Every child holds: their conditions in one ``must`` (nested ``must`` / ``must_not`` lifted)."""
    must: list[dict[str, Any]] = []
    must_not: list[dict[str, Any]] = []
    for child in children:
        if child == NOTHING:
            return NOTHING
        if child == EVERYTHING:
            continue
        if _is_filter(child) and "should" not in child:
            must.extend(child.get("must", []))
            must_not.extend(child.get("must_not", []))
        else:
            must.append(child)
    out: dict[str, Any] = {}
    if must:
        out["must"] = must
    if must_not:
        out["must_not"] = must_not
    return out


def _any(children: list[dict[str, Any]]) -> dict[str, Any]:
    """At least one child holds (an OR inside an OR lifted: one level fewer)."""
    kept: list[dict[str, Any]] = []
    for child in children:
        if child == EVERYTHING:
            return EVERYTHING
        if child == NOTHING:
            continue
        kept.extend(child["should"] if set(child) == {"should"} else [child])
    if not kept:
        return NOTHING
    if len(kept) == 1:
        return kept[0]
    return {"should": kept}


def _negate(condition: dict[str, Any]) -> dict[str, Any]:
    """Not ``condition``, as shallow as it goes: a double negation undone, NOT(a OR b) as
    ``must_not: [a, b]``."""
    if condition == NOTHING:
        return EVERYTHING
    if condition == EVERYTHING:
        return NOTHING
    if set(condition) == {"must_not"} and len(condition["must_not"]) == 1:
        inner: dict[str, Any] = condition["must_not"][0]
        return inner if _is_filter(inner) else {"must": [inner]}
    if set(condition) == {"should"}:
        return {"must_not": list(condition["should"])}
    return {"must_not": [condition]}


def _as_filter(condition: dict[str, Any]) -> dict[str, Any]:
    """A condition as a top-level filter."""
    return condition if _is_filter(condition) else {"must": [condition]}
