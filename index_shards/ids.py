"""Stable int64 ids for string doc ids: the same document maps to the same FAISS id on every
build, every shard and every machine, so deletes and upserts can address it later."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from retrieval.errors import BuildError
from retrieval.routing import doc_int_id

__all__ = ["doc_int_id", "doc_int_ids"]


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
