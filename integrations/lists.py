"""Lists longer than one filter condition holds, as frameworks hand them over: a condition naming
any number of ids (``has_id``) or values (``match.any``), and reading documents by id (with a
filter too) a listing page at a time.

A ``has_id`` or a ``match.any`` holds at most 1,024 entries (``retrieval.filters.MAX_VALUES``), so
a longer list is cut into chunks: in a filter, a ``should`` of them (at most
``MAX_LIST_ITEMS`` chunks); when reading by id, one listing per chunk — a request for a thousand
ids rather than a ``GET`` each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from retrieval.client import AsyncShardragClient, ShardragClient
from retrieval.filters import MAX_LIST_ITEMS, MAX_VALUES

# ids in one has_id condition: within the filter language's 1,024, and one listing page (1,000)
IDS_PER_CONDITION = 1000
MAX_IDS_IN_FILTER = MAX_LIST_ITEMS * IDS_PER_CONDITION  # a should of MAX_LIST_ITEMS has_id chunks
MAX_VALUES_IN_FILTER = MAX_LIST_ITEMS * MAX_VALUES  # ... of match.any chunks
assert IDS_PER_CONDITION <= MAX_VALUES


def id_chunks(ids: Iterable[str]) -> list[list[str]]:
    """``ids`` without repeats, in their order, in lists one ``has_id`` holds."""
    unique = list(dict.fromkeys(ids))
    return [unique[start:start + IDS_PER_CONDITION] for start in range(0, len(unique), IDS_PER_CONDITION)]


def ids_condition(ids: Sequence[str]) -> dict[str, Any]:
    """One filter condition that selects the documents ``ids`` names (at least one id, at most
    :data:`MAX_IDS_IN_FILTER` distinct ones: a query's filter is one request)."""
    chunks = id_chunks(ids)
    if not chunks:
        raise ValueError("a condition on ids needs at least one id")
    if len(chunks) > MAX_LIST_ITEMS:
        raise ValueError(f"a filter names at most {MAX_IDS_IN_FILTER:,} ids, got {sum(map(len, chunks)):,}")
    return {"has_id": chunks[0]} if len(chunks) == 1 else {"should": [{"has_id": chunk} for chunk in chunks]}


def any_condition(key: str, values: Sequence[Any]) -> dict[str, Any]:
    """One filter condition: ``key`` holds one of ``values`` (at least one; at most
    :data:`MAX_VALUES_IN_FILTER`). Values are not de-duplicated: ``True`` and ``1`` are different
    values to a filter and the same to a Python set."""
    given = list(values)
    if not given:
        raise ValueError(f"a condition on {key!r} needs at least one value")
    if len(given) > MAX_VALUES_IN_FILTER:
        raise ValueError(f"a filter on {key!r} lists at most {MAX_VALUES_IN_FILTER:,} values, got {len(given):,}")
    chunks = [given[start:start + MAX_VALUES] for start in range(0, len(given), MAX_VALUES)]
    conditions = [{"key": key, "match": {"any": chunk}} for chunk in chunks]
    return conditions[0] if len(conditions) == 1 else {"should": conditions}


def _listing_filter(chunk: list[str], filter_: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"must": [{"has_id": chunk}, dict(filter_)] if filter_ else [{"has_id": chunk}]}


def _in_order(ids: Iterable[str], found: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [found[doc_id] for doc_id in dict.fromkeys(ids) if doc_id in found]


def read_by_ids(client: ShardragClient, ids: Sequence[str], filter_: Mapping[str, Any] | None = None, *,
                with_vectors: bool = False) -> list[dict[str, Any]]:
    """The live documents of ``ids`` (those ``filter_`` selects too), in the order of ``ids``,
    each once; absent ids are left out. Read on each shard's primary (``ShardragClient.scroll``):
    the caller's acknowledged writes are there."""
    found: dict[str, dict[str, Any]] = {}
    for chunk in id_chunks(ids):
        for document in client.documents(filter=_listing_filter(chunk, filter_), page_size=IDS_PER_CONDITION,
                                          with_vectors=with_vectors):
            found[document["id"]] = document
    return _in_order(ids, found)


async def aread_by_ids(client: AsyncShardragClient, ids: Sequence[str], filter_: Mapping[str, Any] | None = None, *,
                       with_vectors: bool = False) -> list[dict[str, Any]]:
    """:func:`read_by_ids` on the async client."""
    found: dict[str, dict[str, Any]] = {}
    for chunk in id_chunks(ids):
        async for document in client.documents(filter=_listing_filter(chunk, filter_), page_size=IDS_PER_CONDITION,
                                                with_vectors=with_vectors):
            found[document["id"]] = document
    return _in_order(ids, found)
