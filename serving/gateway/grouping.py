"""``group_by`` of ``POST /v1/query``: the ``k`` best groups of hits that share a metadata value
(Qdrant's search groups, Milvus's grouping search) — "the 5 best source files, their best 2
passages each" rather than 10 passages of one file.

A group ranks by its best hit, and holds its best ``group_size`` hits. The query is searched in
any mode, ``depth`` hits deep; the first ``k`` distinct values in that ranked list are the ``k``
best groups (a group's best hit is its first one), and each group is complete once it holds
``group_size`` hits from the list. When some of the ``k`` groups are not full — or fewer than
``k`` values appeared — the query is searched again twice as deep, on the version the first
round read (a rollout between rounds never mixes models), until the groups are full, the list
runs out (fewer hits than asked: every matching document was read), or ``limits.max_group_read``
is reached; then the answer says it is not ``filled``. A deeper round that loses a shard the
round before had (its deadline, most often) leaves that whole round's groups, not filled. So the
groups are those of the exact ranked list whenever the list itself is exact, at any shard count.

A document joins the group of its value; a list value joins every element's group (as a
``match`` filter reads lists); a document without the key, or with an empty list, joins none.
Values are compared as filters compare them: ``1`` and ``1.0`` are one group, ``true`` another.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from retrieval.errors import InvalidRequest
from retrieval.filters import MAX_KEY_CHARS, is_scalar, tagged

FIRST_READ_PER_HIT = 4  # the first round reads 4 hits for every one the groups can hold
FIRST_READ_MIN = 20  # ... and never fewer (most values' groups appear within 20 of a chunked corpus)


@dataclass(slots=True)
class Grouping:
    """What grouping did, for the diagnostics."""

    by: str
    size: int
    groups: int  # groups answered
    read: int  # how deep the last round read
    rounds: int
    filled: bool  # every group holds group_size hits, or the ranked list ran out

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "size": self.size, "groups": self.groups, "read": self.read, "rounds": self.rounds,
                "filled": self.filled}


def check_grouping(group_by: str | None, group_size: int | None, k: int, max_read: int) -> None:
    """Refuse a grouping the query cannot hold (422 naming the field)."""
    if group_by is None:
        if group_size is not None:
            raise InvalidRequest("group_size sizes the groups of group_by, and group_by is not given",
                                 field="group_size")
        return
    if not group_by or len(group_by) > MAX_KEY_CHARS:
        raise InvalidRequest(f"group_by must be a metadata key of 1 to {MAX_KEY_CHARS} characters", field="group_by")
    size = group_size or 1
    if k * size > max_read:
        raise InvalidRequest(f"k × group_size is {k * size}; a grouped query holds at most {max_read} hits",
                             field="group_size" if group_size else "k")


def first_depth(k: int, size: int, max_read: int) -> int:
    return min(max_read, max(FIRST_READ_MIN, FIRST_READ_PER_HIT * k * size))


def _values(metadata: dict[str, Any] | None, key: str) -> Iterator[Any]:
    value = (metadata or {}).get(key)
    for item in value if isinstance(value, list) else (value,):
        if is_scalar(item):
            yield item


def group_hits(hits: list[dict[str, Any]], key: str, k: int,
               size: int) -> tuple[list[dict[str, Any]], int, bool]:
    """The hits of the first ``k`` groups of ``hits`` (ranked, each with its ``metadata``), group by
    group in rank order, each hit's ``group`` set to its group's value (a hit in two groups appears
    in both); how many groups; and whether ``k`` groups were found, each with ``size`` hits."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for hit in hits:
        for value in _values(hit.get("metadata"), key):
            members = groups.get(tagged(value))
            if members is None:
                if len(groups) == k:
                    continue  # a group below the k-th: not answered
                members = groups[tagged(value)] = []
            if len(members) < size:  # the group's value as its best hit has it (1, not 1.0)
                members.append({**hit, "group": members[0]["group"] if members else value})
    filled = len(groups) == k and all(len(members) == size for members in groups.values())
    return [hit for members in groups.values() for hit in members], len(groups), filled
