"""The documents a filter keeps on one shard, in the frames the filtered search reads them in.

The payload index answers a filter with a boolean mask by *payload position* (docs.sqlite's
order). The searches want other shapes: the int ids (an exact scan, FAISS's ``IDSelectorBatch``
over an IVF's own ids), the smaller set of the rejected ones, or a bitmap by *storage position*
(the index's own row numbers under its id map). Converting ids to positions per query cost more
than the search: a filter keeping half of 1M documents meant a 500k-id hash set (~30 ms to fill,
more to free) and 500k binary searches. So a :class:`PayloadFrame`, made once per loaded shard,
maps payload positions to storage positions (or to IVF lists), and a :class:`Selection` makes
each shape only when a search path asks for it: a bitmap over 1M positions is one gather and
one ``packbits`` (~2 ms), and FAISS's ``IDSelectorBitmap`` answers a membership question with one
bit test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from retrieval.errors import IndexIntegrityError

NOT_STORED = -1  # a payload position whose document has no vector in the index
# an IVF's per-list counts sum every document's flag by list once more than 1/5 of them are kept
# (a fixed cost); fewer, the kept documents' lists are counted (a cost that grows with them)
PER_LIST_GATHER_SHARE = 5


@dataclass(slots=True)
class PayloadFrame:
    """Where each payload position's document is: the payload's int ids sorted (to find a
    position by id), and — for an index under an id map — each storage position's payload
    position; for an IVF over its own ids, each payload position's list. Made once per shard on
    its first filtered search (~12 bytes a document, and 4 more for the storage or list map)."""

    payload_ids: np.ndarray  # int ids by payload position
    sorted_ids: np.ndarray  # the same, ascending
    order: np.ndarray  # int32/int64: the payload position of each sorted id
    vectored: np.ndarray  # bool by payload position: the document has a vector in the index
    every_vectored: bool = True  # no document lacks a vector
    payload_of_storage: np.ndarray | None = None  # by storage position (id-map indexes)
    list_of_payload: np.ndarray | None = None  # by payload position, NOT_STORED when not in the IVF
    list_members: np.ndarray | None = None  # payload positions grouped by IVF list ...
    list_offsets: np.ndarray | None = None  # ... list i's from list_offsets[i] to list_offsets[i + 1]

    @classmethod
    def build(cls, payload_ids: np.ndarray, bare: np.ndarray) -> PayloadFrame:
        """``bare``: the sorted int ids of the documents that have no vector."""
        order = np.argsort(payload_ids, kind="stable").astype(_index_type(payload_ids.size))
        vectored = np.ones(payload_ids.size, dtype=bool)
        frame = cls(payload_ids, payload_ids[order], order, vectored)
        if bare.size:
            vectored[frame.positions_of(bare)] = False
            frame.every_vectored = bool(vectored.all())
        return frame

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """The payload positions of those of ``ids`` the payload holds (the others are skipped)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not self.sorted_ids.size or not ids.size:
            return np.zeros(0, dtype=np.int64)
        slots = np.minimum(np.searchsorted(self.sorted_ids, ids), self.sorted_ids.size - 1)
        found = self.sorted_ids[slots] == ids
        positions: np.ndarray = self.order[slots[found]].astype(np.int64)
        return positions

    def attach_storage(self, stored_ids: np.ndarray) -> None:
        """Map storage positions (the id map's ids, in order) to payload positions. A stored id
        the payload does not know is a damaged shard, refused."""
        slots = np.minimum(np.searchsorted(self.sorted_ids, stored_ids), max(self.sorted_ids.size - 1, 0))
        found = self.sorted_ids[slots] == stored_ids if self.sorted_ids.size else np.zeros(stored_ids.size, bool)
        if not found.all():
            raise IndexIntegrityError(f"the index holds vectors under ids the documents do not: "
                                      f"{stored_ids[~found][:5].tolist()}")
        self.payload_of_storage = self.order[slots]

    def attach_lists(self, stored_sorted: np.ndarray, owner_sorted: np.ndarray) -> None:
        """Map payload positions to IVF lists (``stored_sorted``: the lists' ids ascending,
        ``owner_sorted``: each one's list)."""
        lists = np.full(self.payload_ids.size, NOT_STORED, dtype=np.int32)
        if stored_sorted.size:
            slots = np.minimum(np.searchsorted(stored_sorted, self.payload_ids), stored_sorted.size - 1)
            found = stored_sorted[slots] == self.payload_ids
            lists[found] = owner_sorted[slots[found]]
        self.list_of_payload = lists
        listed = np.flatnonzero(lists >= 0)
        self.list_members = listed[np.argsort(lists[listed], kind="stable")].astype(self.order.dtype)
        counts = np.bincount(lists[listed], minlength=int(lists.max(initial=-1)) + 1)
        self.list_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


@dataclass(slots=True)
class Selection:
    """The documents one filter keeps that the index can return: the payload's mask less the
    documents without a vector and the ``exclude``d ones (tombstones). Each shape is made on its
    first use."""

    kept: np.ndarray  # bool by payload position
    payload_ids: np.ndarray
    frame: PayloadFrame | None = None  # None: given as ids, no payload index behind it
    _allowed: np.ndarray | None = field(default=None, repr=False)
    _matches: int | None = field(default=None, repr=False)
    _per_list: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def of(cls, mask: np.ndarray, frame: PayloadFrame, exclude: np.ndarray | None = None) -> Selection:
        """``mask``: the payload's, by position (not changed here)."""
        excluding = exclude is not None and exclude.size > 0
        if frame.every_vectored:  # the common case: nothing to take out but the tombstones
            kept = mask.copy() if excluding else mask
        else:
            kept = mask & frame.vectored
        if excluding:
            assert exclude is not None
            kept[frame.positions_of(exclude)] = False
        return cls(kept, frame.payload_ids, frame)

    @classmethod
    def of_ids(cls, allowed: np.ndarray) -> Selection:
        """A selection given as the int ids themselves (no payload index behind it)."""
        allowed = np.asarray(allowed, dtype=np.int64)
        return cls(np.ones(allowed.size, dtype=bool), allowed, _allowed=allowed, _matches=int(allowed.size))

    @property
    def matches(self) -> int:
        if self._matches is None:
            self._matches = int(np.count_nonzero(self.kept))
        return self._matches

    @property
    def allowed(self) -> np.ndarray:
        """The int ids kept, in payload order."""
        if self._allowed is None:
            self._allowed = self.payload_ids[self.kept]
        return self._allowed

    def rejected(self) -> np.ndarray | None:
        """Every other id of the payload, when they are the smaller set (a selector built from
        them costs less); else None."""
        if 2 * self.matches <= self.kept.size:
            return None
        rejected: np.ndarray = self.payload_ids[~self.kept]
        return rejected

    def storage_mask(self) -> np.ndarray | None:
        """The kept documents by storage position; None without a storage map."""
        if self.frame is None or self.frame.payload_of_storage is None:
            return None
        kept: np.ndarray = self.kept[self.frame.payload_of_storage]
        return kept

    def ids_in_lists(self, lists: np.ndarray) -> tuple[np.ndarray, bool]:
        """For a selector over IVF ``lists`` alone (the frame must hold the list layout): the kept
        int ids they hold, or — when fewer — the others they hold (then True: to be negated)."""
        frame = self.frame
        assert frame is not None and frame.list_members is not None and frame.list_offsets is not None
        assert frame.list_of_payload is not None
        offsets, members = frame.list_offsets, frame.list_members
        lists = lists[lists < offsets.size - 1]  # (lists past the last non-empty one hold nothing)
        if not lists.size:
            return np.zeros(0, dtype=np.int64), False
        if lists.size * 8 < offsets.size:  # a few lists: their slices
            positions = np.concatenate([members[offsets[i]:offsets[i + 1]] for i in lists.tolist()])
        else:  # many: one pass over every document's list (NOT_STORED reads the last, False, entry)
            wanted = np.zeros(offsets.size, dtype=bool)
            wanted[lists] = True
            positions = np.flatnonzero(wanted[frame.list_of_payload])
        inside = self.kept[positions]
        kept = int(np.count_nonzero(inside))
        if 2 * kept <= positions.size:
            return self.payload_ids[positions[inside]], False
        return self.payload_ids[positions[~inside]], True

    def per_list(self, nlist: int) -> np.ndarray | None:
        """How many kept documents each IVF list holds; None without a list map."""
        if self.frame is None or self.frame.list_of_payload is None:
            return None
        if self._per_list is None:
            members, offsets = self.frame.list_members, self.frame.list_offsets
            assert members is not None and offsets is not None
            if self.matches * PER_LIST_GATHER_SHARE < self.kept.size:  # the kept documents' lists, counted
                lists = self.frame.list_of_payload[self.kept]
                self._per_list = np.bincount(lists[lists >= 0], minlength=nlist)[:nlist]
                return self._per_list
            # many kept: every document's flag grouped by list, summed per list — a fixed cost (at 1M,
            # 2.7 ms against 5.6 for half of them counted; 0.3 against 2.7 for 1 %)
            counts = np.zeros(max(nlist, offsets.size - 1), dtype=np.int64)
            starts = offsets[:-1]
            filled = np.flatnonzero(offsets[1:] > starts)  # (reduceat reads an empty segment as one element)
            if filled.size:
                counts[filled] = np.add.reduceat(self.kept[members].view(np.uint8), starts[filled], dtype=np.int64)
            self._per_list = counts[:nlist]
        return self._per_list


def _index_type(size: int) -> type[np.signedinteger]:
    return np.int32 if size < np.iinfo(np.int32).max else np.int64
