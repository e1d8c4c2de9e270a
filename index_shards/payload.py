"""The payload index of one shard: its documents' metadata as in-memory columns, so a filter
becomes a boolean mask over the shard's documents without touching SQLite.

* equality: key → value → the positions holding it (every element of a list value counts);
* ranges: key → the numeric values sorted, with their positions (two binary searches per range);
* date-time ranges: key → its distinct date-time strings as instants, sorted, with their positions
  (made from the equality map on the first such range over the key: each distinct string is read
  once);
* presence (``is_empty``): key → the positions holding a value (made on the first question);
* ids: doc id → position (``has_id``), and the ids in ascending order (made for the first
  listing: ``LiveShard.scan``).

Built once when the shard loads (one pass over ``docs.sqlite``). Memory is about 16 bytes per
(document, key) pair plus Python's dict overhead per distinct value.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.datetimes import instant
from retrieval.filters import Condition, DateRange, Filter, HasId, IsEmpty, Match, Range, is_scalar, tagged


@dataclass(slots=True, frozen=True)
class _NumericColumn:
    values: np.ndarray  # float64, ascending
    positions: np.ndarray  # int64, the document position of each value


class PayloadIndex:
    def __init__(self, rows: Iterable[tuple[int, str, Mapping[str, Any]]]) -> None:
        """``rows``: (int id, doc id, metadata) of every document of the shard."""
        int_ids: list[int] = []
        self._position_of: dict[str, int] = {}
        equality: dict[str, dict[tuple[str, Any], list[int]]] = defaultdict(lambda: defaultdict(list))
        numeric: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for position, (int_id, doc_id, metadata) in enumerate(rows):
            int_ids.append(int(int_id))
            self._position_of[doc_id] = position
            for key, value in metadata.items():
                for element in value if isinstance(value, list) else (value,):
                    if is_scalar(element):
                        equality[key][tagged(element)].append(position)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and is_scalar(value):
                    numeric[key].append((float(value), position))
        self.int_ids = np.asarray(int_ids, dtype=np.int64)
        self._ids: set[int] | None = None  # made on the first membership question
        self._equality = {key: {value: np.asarray(positions, dtype=np.int64) for value, positions in by_value.items()}
                          for key, by_value in equality.items()}
        self._numeric = {}
        for key, pairs in numeric.items():
            pairs.sort()
            self._numeric[key] = _NumericColumn(np.asarray([v for v, _ in pairs], dtype=np.float64),
                                                np.asarray([p for _, p in pairs], dtype=np.int64))
        self._dates: dict[str, _NumericColumn] = {}
        self._present: dict[str, np.ndarray] = {}
        self._ordered: tuple[list[str], np.ndarray] | None = None

    @property
    def size(self) -> int:
        return int(self.int_ids.size)

    def ordered(self) -> tuple[list[str], np.ndarray]:
        """Every doc id in ascending order, and each one's position (made on the first listing)."""
        if self._ordered is None:
            ids = sorted(self._position_of)
            self._ordered = (ids, np.fromiter((self._position_of[i] for i in ids), dtype=np.int64, count=len(ids)))
        return self._ordered

    def contains(self, int_id: int) -> bool:
        """Whether the shard holds this document."""
        if self._ids is None:
            self._ids = set(self.int_ids.tolist())
        return int_id in self._ids

    def mask(self, filter_: Filter) -> np.ndarray:
        """Which documents (by position) ``filter_`` selects."""
        n = self.size
        selected = np.ones(n, dtype=bool)
        for condition in filter_.must:
            selected &= self._condition(condition)
        if filter_.should:
            any_of = np.zeros(n, dtype=bool)
            for condition in filter_.should:
                any_of |= self._condition(condition)
            selected &= any_of
        for condition in filter_.must_not:
            selected &= ~self._condition(condition)
        return selected

    def select(self, filter_: Filter) -> np.ndarray:
        """The int ids ``filter_`` selects (in position order)."""
        selected: np.ndarray = self.int_ids[self.mask(filter_)]
        return selected

    def _condition(self, condition: Condition) -> np.ndarray:
        out = np.zeros(self.size, dtype=bool)
        if isinstance(condition, Filter):
            return self.mask(condition)
        if isinstance(condition, HasId):
            out[[self._position_of[d] for d in condition.ids if d in self._position_of]] = True
        elif isinstance(condition, Match):
            by_value = self._equality.get(condition.key, {})
            for value in condition.values:
                holders = by_value.get(value)
                if holders is not None:
                    out[holders] = True
        elif isinstance(condition, (Range, DateRange)):
            column = self._numeric.get(condition.key) if isinstance(condition, Range) else self._dates_of(condition.key)
            if column is not None:
                low, high = _bounds(column.values, condition)
                out[column.positions[low:high]] = True
        elif isinstance(condition, IsEmpty):
            out[:] = True
            out[self._present_of(condition.key)] = False
        return out

    def _dates_of(self, key: str) -> _NumericColumn:
        column = self._dates.get(key)
        if column is None:
            pairs: list[tuple[float, np.ndarray]] = []
            for (kind, value), positions in self._equality.get(key, {}).items():
                at = instant(value) if kind == "str" and isinstance(value, str) else None
                if at is not None:
                    pairs.append((at, positions))
            pairs.sort(key=lambda pair: pair[0])
            values = [at for at, positions in pairs for _ in range(positions.size)]
            column = _NumericColumn(np.asarray(values, dtype=np.float64),
                                    np.concatenate([p for _, p in pairs]) if pairs else np.zeros(0, dtype=np.int64))
            self._dates[key] = column
        return column

    def _present_of(self, key: str) -> np.ndarray:
        present = self._present.get(key)
        if present is None:
            parts = list(self._equality.get(key, {}).values())
            present = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
            self._present[key] = present
        return present


def _bounds(values: np.ndarray, condition: Range | DateRange) -> tuple[int, int]:
    """The slice of ascending ``values`` inside the range."""
    low, high = 0, len(values)
    if condition.gte is not None:
        low = max(low, int(np.searchsorted(values, condition.gte, side="left")))
    if condition.gt is not None:
        low = max(low, int(np.searchsorted(values, condition.gt, side="right")))
    if condition.lte is not None:
        high = min(high, int(np.searchsorted(values, condition.lte, side="right")))
    if condition.lt is not None:
        high = min(high, int(np.searchsorted(values, condition.lt, side="left")))
    return low, max(low, high)
