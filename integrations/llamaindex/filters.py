"""LlamaIndex ``MetadataFilters`` in shardrag's filter language (docs/filters.md).

| LlamaIndex | shardrag |
|---|---|
| ``==``, ``contains`` (a list holds the value) | ``match.value`` |
| ``!=`` | ``must_not`` ``match.value`` (a document without the key passes, as in Python) |
| ``>``, ``>=``, ``<``, ``<=`` | ``range``: numbers, or ISO 8601 date-time strings (compared as instants) |
| ``in``, ``any`` | ``match.any`` |
| ``nin`` | ``must_not`` ``match.any`` |
| ``all`` | one ``match.value`` per value, all in ``must`` |
| ``is_empty`` | ``is_empty`` (the key is absent or an empty list; ``None`` values are not stored) |
| ``and`` / ``or`` / ``not`` | ``must`` / ``should`` / ``must_not`` (``not``: none of them holds) |

``text_match`` and ``text_match_insensitive`` raise ``NotImplementedError`` naming the operator:
shardrag filters have no substring match (a ``lexical`` or ``hybrid`` query searches the text).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from integrations.lists import any_condition
from retrieval.datetimes import instant

_RANGES = {FilterOperator.GT: "gt", FilterOperator.GTE: "gte", FilterOperator.LT: "lt", FilterOperator.LTE: "lte"}
_GROUPS = {FilterCondition.AND: "must", FilterCondition.OR: "should", FilterCondition.NOT: "must_not"}


def to_shardrag(filters: MetadataFilters) -> dict[str, Any]:
    """The shardrag filter that selects what ``filters`` selects."""
    group = _GROUPS[filters.condition or FilterCondition.AND]
    clauses = [to_shardrag(f) if isinstance(f, MetadataFilters) else _clause(f) for f in filters.filters]
    return {group: clauses} if clauses else {}


def _clause(given: MetadataFilter) -> dict[str, Any]:  # (ExactMatchFilter is the same class)
    key, value, operator = given.key, given.value, given.operator
    if operator in (FilterOperator.EQ, FilterOperator.CONTAINS):
        return {"key": key, "match": {"value": value}}
    if operator == FilterOperator.NE:
        return {"must_not": [{"key": key, "match": {"value": value}}]}
    if operator in _RANGES:
        if isinstance(value, bool) or not (isinstance(value, int | float) or
                                           (isinstance(value, str) and instant(value) is not None)):
            raise ValueError(f"filter on {key!r}: {operator.value} compares numbers or ISO 8601 date-times, "
                             f"got {value!r}")
        return {"key": key, "range": {_RANGES[operator]: value}}
    if operator == FilterOperator.IS_EMPTY:
        return {"is_empty": {"key": key}}
    if operator in (FilterOperator.IN, FilterOperator.ANY, FilterOperator.NIN, FilterOperator.ALL):
        values = value if isinstance(value, list) else [value]
        if operator == FilterOperator.ALL:
            return {"must": [{"key": key, "match": {"value": v}} for v in values]}
        if not values:  # in [] selects nothing, nin [] everything
            return {"must_not": [{}]} if operator != FilterOperator.NIN else {}
        clause = any_condition(key, values)
        return {"must_not": [clause]} if operator == FilterOperator.NIN else clause
    raise NotImplementedError(f"filter on {key!r}: shardrag has no {operator.value!r} operator "
                              "(docs/integrations.md lists the ones it maps)")
