"""Metadata filters: a Qdrant-like JSON language, parsed once into a small typed tree.

    {"must": [...], "should": [...], "must_not": [...]}            a filter (clauses may nest)
    {"key": "lang", "match": {"value": "en"}}                      equality (any element of a list)
    {"key": "tag",  "match": {"any": ["a", "b"]}}                   one of several values
    {"key": "year", "range": {"gte": 2020, "lt": 2024}}             numeric range (gt, gte, lt, lte)
    {"key": "at", "range": {"gt": "2024-01-31T12:00:00Z"}}          date-time range (RFC 3339 bounds)
    {"is_empty": {"key": "lang"}}                                   the key is absent (or an empty list)
    {"has_id": ["doc-1", "doc-2"]}                                  by document id

``must``: every clause holds; ``should``: at least one holds (when there are any); ``must_not``:
none holds. An empty filter ``{}`` matches everything. Parsing refuses anything else with an
:class:`InvalidRequest` whose ``field`` is the path of the bad clause (``filter.must[1].range.gte``).

Metadata values are strings, integers, floats, booleans or lists of strings. A ``match`` on a
list-valued key holds when any element matches; a numeric ``range`` holds only on a number (never
on a boolean or a string), a date-time ``range`` (every bound an RFC 3339 string; no offset means
UTC) only on a string that is one, compared as instants. Booleans match booleans only (``true`` is
not ``1``).

The tree evaluates itself against one document (:meth:`Filter.matches`, the reference the
shards' payload index is tested against) and has a canonical JSON form (:meth:`Filter.canonical`)
that travels to the shards and keys request batching.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union

from retrieval.datetimes import instant
from retrieval.errors import InvalidRequest

MAX_DEPTH = 4  # nested filters below the top one (the OpenAPI schema spells out each level)
MAX_CLAUSES = 256  # conditions in one filter, all levels together
MAX_LIST_ITEMS = 16  # conditions in one must / should / must_not list
MAX_VALUES = 1024  # values in one `any` or `has_id`
MAX_KEY_CHARS = 128
MAX_VALUE_CHARS = 1024
MAX_METADATA_KEYS = 64  # keys of one document's metadata
OCCURS = ("must", "should", "must_not")
RANGE_BOUNDS = ("gt", "gte", "lt", "lte")

Scalar = str | int | float | bool


@dataclass(slots=True, frozen=True)
class Match:
    key: str
    values: frozenset[tuple[str, Scalar]]  # (type tag, value): True and 1 stay apart

    def holds(self, metadata: Mapping[str, Any]) -> bool:
        value = metadata.get(self.key)
        if isinstance(value, list):
            return any(tagged(v) in self.values for v in value if is_scalar(v))
        return value is not None and is_scalar(value) and tagged(value) in self.values


@dataclass(slots=True, frozen=True)
class Range:
    key: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None

    def holds(self, metadata: Mapping[str, Any]) -> bool:
        value = metadata.get(self.key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return self.admits(float(value))

    def admits(self, value: float) -> bool:
        return within(self, value)


def within(bounds: Range | DateRange, value: float) -> bool:
    """Whether ``value`` lies inside the bounds of a range (numeric, or instants of a date-time one)."""
    return ((bounds.gt is None or value > bounds.gt) and (bounds.gte is None or value >= bounds.gte)
            and (bounds.lt is None or value < bounds.lt) and (bounds.lte is None or value <= bounds.lte))


@dataclass(slots=True, frozen=True)
class DateRange:
    """A range over date-time strings: bounds are instants (seconds since the epoch, UTC); ``given``
    keeps the bounds as they were written, for the canonical form."""

    key: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None
    given: tuple[tuple[str, str], ...] = ()

    def holds(self, metadata: Mapping[str, Any]) -> bool:
        value = metadata.get(self.key)
        at = instant(value) if isinstance(value, str) else None
        return at is not None and within(self, at)


@dataclass(slots=True, frozen=True)
class IsEmpty:
    """The key is absent from the metadata, or holds an empty list."""

    key: str

    def holds(self, metadata: Mapping[str, Any]) -> bool:
        value = metadata.get(self.key)
        return value is None or value == []


@dataclass(slots=True, frozen=True)
class HasId:
    ids: frozenset[str]


Condition = Union[Match, Range, DateRange, IsEmpty, HasId, "Filter"]  # noqa: UP007 - a forward reference needs Union


@dataclass(slots=True, frozen=True)
class Filter:
    must: tuple[Condition, ...] = ()
    should: tuple[Condition, ...] = ()
    must_not: tuple[Condition, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.must or self.should or self.must_not)

    def matches(self, doc_id: str, metadata: Mapping[str, Any]) -> bool:
        def holds(condition: Condition) -> bool:
            if isinstance(condition, HasId):
                return doc_id in condition.ids
            if isinstance(condition, Filter):
                return condition.matches(doc_id, metadata)
            return condition.holds(metadata)

        return (all(holds(c) for c in self.must) and (not self.should or any(holds(c) for c in self.should))
                and not any(holds(c) for c in self.must_not))

    def pins(self, key: str) -> bool:
        """Whether every document it selects has a ``match`` on ``key`` (a must clause matching
        ``key``, here or in a must sub-filter): the selection lies inside those values' partitions."""
        return any((isinstance(c, Match) and c.key == key) or (isinstance(c, Filter) and c.pins(key))
                   for c in self.must)

    def to_json(self) -> dict[str, Any]:
        return {occur: [_condition_json(c) for c in getattr(self, occur)] for occur in OCCURS
                if getattr(self, occur)}

    def canonical(self) -> str:
        """Compact JSON with sorted keys and values: what travels to the shards and keys batches."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not (isinstance(value, float) and not math.isfinite(value))


def tagged(value: Scalar) -> tuple[str, Scalar]:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", float(value))
    return ("str", value)


def untagged(pair: tuple[str, Scalar]) -> Scalar:
    kind, value = pair
    if kind == "num" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _condition_json(condition: Condition) -> dict[str, Any]:
    if isinstance(condition, Filter):
        return condition.to_json()
    if isinstance(condition, HasId):
        return {"has_id": sorted(condition.ids)}
    if isinstance(condition, Range):
        bounds = {name: getattr(condition, name) for name in RANGE_BOUNDS if getattr(condition, name) is not None}
        return {"key": condition.key, "range": bounds}
    if isinstance(condition, DateRange):
        return {"key": condition.key, "range": dict(condition.given)}
    if isinstance(condition, IsEmpty):
        return {"is_empty": {"key": condition.key}}
    values = sorted(condition.values, key=lambda t: (t[0], str(t[1])))
    if len(values) == 1:
        return {"key": condition.key, "match": {"value": untagged(values[0])}}
    return {"key": condition.key, "match": {"any": [untagged(v) for v in values]}}


class _Parser:
    def __init__(self) -> None:
        self.clauses = 0

    def filter(self, data: Any, path: str, depth: int) -> Filter:
        if not isinstance(data, Mapping):
            raise InvalidRequest(f"{path} must be an object with must / should / must_not", field=path)
        unknown = sorted(set(data) - set(OCCURS))
        if unknown:
            raise InvalidRequest(f"{path}: unknown clause {unknown[0]!r}; use must, should or must_not",
                                 field=f"{path}.{unknown[0]}")
        parts: dict[str, tuple[Condition, ...]] = {}
        for occur in OCCURS:
            items = data.get(occur)
            if items is None:
                continue
            if not isinstance(items, list) or len(items) > MAX_LIST_ITEMS:
                raise InvalidRequest(f"{path}.{occur} must be a list of at most {MAX_LIST_ITEMS} conditions",
                                     field=f"{path}.{occur}")
            parts[occur] = tuple(self.condition(item, f"{path}.{occur}[{i}]", depth) for i, item in enumerate(items))
        return Filter(**parts)

    def condition(self, data: Any, path: str, depth: int) -> Condition:
        self.clauses += 1
        if self.clauses > MAX_CLAUSES:
            raise InvalidRequest(f"the filter has more than {MAX_CLAUSES} conditions", field=path)
        if not isinstance(data, Mapping):
            raise InvalidRequest(f"{path} must be an object (a condition or a nested filter)", field=path)
        if "has_id" in data:
            if set(data) != {"has_id"}:
                raise InvalidRequest(f"{path}: has_id stands alone", field=path)
            return HasId(frozenset(self.strings(data["has_id"], f"{path}.has_id")))
        if "is_empty" in data:
            if set(data) != {"is_empty"}:
                raise InvalidRequest(f"{path}: is_empty stands alone", field=path)
            inner = data["is_empty"]
            if not isinstance(inner, Mapping) or set(inner) != {"key"}:
                raise InvalidRequest(f"{path}.is_empty must be {{\"key\": name}}", field=f"{path}.is_empty")
            return IsEmpty(self.key(inner["key"], f"{path}.is_empty.key"))
        if "key" in data:
            return self.field_condition(data, path)
        if set(data) & set(OCCURS) or not data:
            if depth >= MAX_DEPTH:
                raise InvalidRequest(f"{path}: filters nest at most {MAX_DEPTH} levels deep", field=path)
            return self.filter(data, path, depth + 1)
        raise InvalidRequest(f"{path}: unknown condition {sorted(data)[0]!r}; use key + match/range, has_id, "
                             "or a nested filter", field=f"{path}.{sorted(data)[0]}")

    def key(self, key: Any, path: str) -> str:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
            raise InvalidRequest(f"{path} must be a non-empty string of at most {MAX_KEY_CHARS} characters",
                                 field=path)
        return key

    def field_condition(self, data: Mapping[str, Any], path: str) -> Condition:
        key = self.key(data["key"], f"{path}.key")
        operators = set(data) - {"key"}
        unknown = sorted(operators - {"match", "range"})
        if unknown:
            raise InvalidRequest(f"{path}: unknown operator {unknown[0]!r}; use match or range",
                                 field=f"{path}.{unknown[0]}")
        if len(operators) != 1:
            raise InvalidRequest(f"{path}: give exactly one of match and range", field=path)
        if "range" in operators:
            return self.range(key, data["range"], f"{path}.range")
        match = data["match"]
        if not isinstance(match, Mapping) or len(match) != 1 or next(iter(match)) not in ("value", "any"):
            raise InvalidRequest(f"{path}.match must be {{\"value\": v}} or {{\"any\": [v, ...]}}",
                                 field=f"{path}.match")
        if "value" in match:
            return Match(key, frozenset([tagged(self.scalar(match["value"], f"{path}.match.value"))]))
        values = match["any"]
        if not isinstance(values, list) or not values or len(values) > MAX_VALUES:
            raise InvalidRequest(f"{path}.match.any must be a list of 1 to {MAX_VALUES} values",
                                 field=f"{path}.match.any")
        return Match(key, frozenset(tagged(self.scalar(v, f"{path}.match.any[{i}]")) for i, v in enumerate(values)))

    def range(self, key: str, data: Any, path: str) -> Range | DateRange:
        if not isinstance(data, Mapping) or not data:
            raise InvalidRequest(f"{path} must be an object of gt / gte / lt / lte", field=path)
        unknown = sorted(set(data) - set(RANGE_BOUNDS))
        if unknown:
            raise InvalidRequest(f"{path}: unknown bound {unknown[0]!r}; use gt, gte, lt or lte",
                                 field=f"{path}.{unknown[0]}")
        dated = any(isinstance(value, str) for value in data.values())
        bounds: dict[str, float] = {}
        for name, value in data.items():
            if dated:
                at = instant(value) if isinstance(value, str) and len(value) <= MAX_VALUE_CHARS else None
                if at is None:
                    raise InvalidRequest(f"{path}.{name} must be an RFC 3339 date-time like the other bounds "
                                         f"(2024-01-31T12:00:00Z), got {value!r}", field=f"{path}.{name}")
                bounds[name] = at
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidRequest(f"{path}.{name} must be a finite number or an RFC 3339 date-time, got "
                                     f"{value!r}", field=f"{path}.{name}")
            else:
                bounds[name] = float(value)
        if dated:
            return DateRange(key, **bounds, given=tuple(sorted((n, str(v)) for n, v in data.items())))
        return Range(key, **bounds)

    def scalar(self, value: Any, path: str) -> Scalar:
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            raise InvalidRequest(f"{path} is longer than {MAX_VALUE_CHARS} characters", field=path)
        if not is_scalar(value):
            raise InvalidRequest(f"{path} must be a string, a finite number or a boolean", field=path)
        return value  # type: ignore[no-any-return]

    def strings(self, values: Any, path: str) -> list[str]:
        if not isinstance(values, list) or not values or len(values) > MAX_VALUES:
            raise InvalidRequest(f"{path} must be a list of 1 to {MAX_VALUES} ids", field=path)
        for i, value in enumerate(values):
            if not isinstance(value, str) or not value:
                raise InvalidRequest(f"{path}[{i}] must be a non-empty string", field=f"{path}[{i}]")
        return list(values)


def parse_filter(data: Any, path: str = "filter") -> Filter:
    """The typed filter for ``data`` (decoded JSON); InvalidRequest naming the bad clause's path."""
    return _Parser().filter(data, path, 0)


@lru_cache(maxsize=512)
def filter_from_canonical(text: str) -> Filter:
    """A filter from its canonical JSON (as the shards receive it); the last few are cached, since
    a batch of queries and its hedges carry the same one."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"filter is not valid JSON: {exc}", field="filter") from exc
    return parse_filter(data)


def check_metadata(metadata: Any, path: str = "metadata") -> dict[str, Any]:
    """Validate a document's metadata: an object of strings, finite numbers, booleans or lists of
    strings (flat: one level), keys non-empty strings."""
    if not isinstance(metadata, Mapping):
        raise InvalidRequest(f"{path} must be an object", field=path)
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidRequest(f"{path} has {len(metadata)} keys; at most {MAX_METADATA_KEYS}", field=path)
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
            raise InvalidRequest(f"{path} keys must be non-empty strings of at most {MAX_KEY_CHARS} characters",
                                 field=path)
        where = f"{path}.{key}"
        if isinstance(value, list):
            if len(value) > MAX_VALUES or not all(isinstance(v, str) and len(v) <= MAX_VALUE_CHARS for v in value):
                raise InvalidRequest(f"{where}: a list holds at most {MAX_VALUES} strings", field=where)
        elif isinstance(value, Mapping):
            raise InvalidRequest(f"{where}: metadata is flat (no nested objects)", field=where)
        elif not is_scalar(value):
            raise InvalidRequest(f"{where} must be a string, a finite number, a boolean or a list of strings",
                                 field=where)
        elif isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            raise InvalidRequest(f"{where} is longer than {MAX_VALUE_CHARS} characters", field=where)
        elif isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            # 64-bit integers, as in Qdrant and SQLite: range filters and the WAL's JSON keep them exact
            raise InvalidRequest(f"{where} is an integer beyond 64 bits (signed)", field=where)
        out[key] = list(value) if isinstance(value, list) else value
    return out


def conditions(filter_: Filter) -> Sequence[Condition]:
    """Every condition of ``filter_`` at any depth (for planning and tests)."""
    out: list[Condition] = []
    for occur in OCCURS:
        for condition in getattr(filter_, occur):
            out.append(condition)
            if isinstance(condition, Filter):
                out.extend(conditions(condition))
    return out
