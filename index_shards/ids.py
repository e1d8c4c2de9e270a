"""Stable int64 ids for string doc ids: the same document maps to the same FAISS id on every
build, every shard and every machine, so deletes and upserts can address it later."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from retrieval.errors import BuildError

_MASK_63 = (1 << 63) - 1  # keep ids positive: FAISS uses -1 for "no result"


def doc_int_id(doc_id: str) -> int:
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8, person=b"shardrag.id").digest()
    return int.from_bytes(digest, "little") & _MASK_63


def doc_int_ids(doc_ids: Iterable[str]) -> np.ndarray:
    """int64 ids for ``doc_ids``; a collision (two ids, one int) is refused, never merged."""
    seen: dict[int, str] = {}
    out = []
    for doc_id in doc_ids:
        value = doc_int_id(doc_id)
        other = seen.setdefault(value, doc_id)
        if other != doc_id:
            raise BuildError(f"doc ids {other!r} and {doc_id!r} hash to the same int64 id; rename one")
        out.append(value)
    return np.asarray(out, dtype=np.int64)
