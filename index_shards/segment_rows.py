"""The mutable segment as searchable rows: an append-only matrix with an alive mask.

The matrix is the segment's only copy of its vectors (a document's record keeps none). A write
appends rows (capacity doubles, so appends are amortised O(1)) and marks the rows of
replaced or deleted documents dead — it never re-stacks the segment, so a search right after a
write costs what any search costs. Rows below the current count never change, so a search takes a
consistent view without copying: (count, a view of the matrix, a copy of the alive mask). When
more than half of the rows are dead the matrix is rebuilt from the live ones.

Metadata columns for filtered searches are kept the same way: a list of payload indexes over
consecutive row ranges, one more per burst of writes, merged into one when there are more than
``MAX_CHUNKS`` (log-structured), so filtering never rescans the segment per write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from index_shards.payload import PayloadIndex
from retrieval.filters import Filter

MAX_CHUNKS = 8


class Row(Protocol):
    @property
    def int_id(self) -> int: ...
    @property
    def doc_id(self) -> str: ...
    @property
    def metadata(self) -> dict[str, Any]: ...


@dataclass(slots=True, frozen=True)
class RowsView:
    rows: list[Any]  # SegmentDoc per row (only the first ``count`` are part of this view)
    count: int
    matrix: np.ndarray  # count × dim: row i is rows[i]'s vector (the only copy the segment keeps)
    norms: np.ndarray  # squared L2 norm per row
    alive: np.ndarray  # bool per row


class SegmentRows:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._rows: list[Any] = []
        self._row_of: dict[str, int] = {}
        self._matrix = np.zeros((64, dim), dtype=np.float32)
        self._norms = np.zeros(64, dtype=np.float32)
        self._alive = np.zeros(64, dtype=bool)
        self._dead = 0
        self._chunks: list[tuple[int, int, PayloadIndex]] = []  # (first row, end row, index)

    @property
    def count(self) -> int:
        return len(self._rows)

    def add(self, row: Row, vector: np.ndarray) -> None:
        """Append ``row`` with its vector (copied into the matrix: the segment's one copy of it)."""
        self.remove(row.doc_id)
        position = len(self._rows)
        if position == self._matrix.shape[0]:
            self._grow(2 * position)
        self._matrix[position] = vector
        stored = self._matrix[position]
        self._norms[position] = float(np.dot(stored, stored))
        self._alive[position] = True
        self._rows.append(row)
        self._row_of[row.doc_id] = position

    def vector(self, doc_id: str) -> np.ndarray | None:
        """A copy of the live row's vector (None when ``doc_id`` has no live row)."""
        position = self._row_of.get(doc_id)
        return None if position is None else self._matrix[position].copy()

    def remove(self, doc_id: str) -> None:
        position = self._row_of.pop(doc_id, None)
        if position is not None:
            self._alive[position] = False
            self._dead += 1

    def maybe_rebuild(self) -> None:
        """Drop dead rows once they are the majority (O(live), rare)."""
        if self._dead > 1024 and self._dead * 2 > len(self._rows):
            rows, matrix, alive = self._rows, self._matrix, self._alive
            self.__init__(self.dim)  # type: ignore[misc]
            for position, row in enumerate(rows):
                if alive[position]:
                    self.add(row, matrix[position])

    def _grow(self, capacity: int) -> None:
        # new arrays (not resized in place): views handed to running searches stay valid
        for name in ("_matrix", "_norms", "_alive"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def view(self) -> RowsView:
        n = len(self._rows)
        return RowsView(self._rows, n, self._matrix[:n], self._norms[:n], self._alive[:n].copy())

    def mask(self, filter_: Filter, count: int) -> np.ndarray:
        """Which of the first ``count`` rows ``filter_`` selects (dead rows included: the caller
        combines with the alive mask)."""
        covered = self._chunks[-1][1] if self._chunks else 0
        if covered < count:
            self._chunks.append((covered, count, PayloadIndex(
                (row.int_id, row.doc_id, row.metadata) for row in self._rows[covered:count])))
        if len(self._chunks) > MAX_CHUNKS:
            end = self._chunks[-1][1]
            self._chunks = [(0, end, PayloadIndex((row.int_id, row.doc_id, row.metadata)
                                                  for row in self._rows[:end]))]
        parts = [index.mask(filter_) for start, end, index in self._chunks if start < count]
        selected = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
        return selected[:count]
