"""What every framework integration shares: where its collection is, making it, vectors as the
collection's metric wants them.

Only the typed clients of ``retrieval.client`` reach the cluster (the import contracts say so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.client import AsyncShardragClient, ShardragClient
from retrieval.errors import Conflict, VersionConflict
from retrieval.session import SessionFloors

# distance → the collection's metric; cosine normalizes every vector on the way in
DISTANCES = {"cosine": "ip", "l2": "l2"}


@dataclass(frozen=True, slots=True)
class StoreTarget:
    """A collection of a running cluster, as an integration reaches it."""

    url: str
    collection: str
    api_key: str | None = None
    timeout_s: float = 30.0
    retries: int = 0  # how many more times a request is sent where that is safe (retrieval.client_retry)

    def client(self) -> ShardragClient:
        return self.root_client().collection(self.collection)

    def root_client(self) -> ShardragClient:
        """A client on the gateway itself (collections are made and dropped there)."""
        return ShardragClient(self.url, api_key=self.api_key, timeout_s=self.timeout_s, retries=self.retries)

    def async_root_client(self) -> AsyncShardragClient:
        return AsyncShardragClient(self.url, api_key=self.api_key, timeout_s=self.timeout_s, retries=self.retries)

    def async_client(self) -> _AsyncCollection:
        return _AsyncCollection(self)


class CollectionLink:
    """A store's way to its collection: the sync client (made on first use), an async client per
    call, and the session floors of the store's writes (every read after them sends them)."""

    def __init__(self, target: StoreTarget) -> None:
        self.target = target
        self.floors = SessionFloors()
        self._client: ShardragClient | None = None

    @property
    def client(self) -> ShardragClient:
        if self._client is None:
            self._client = self.target.client()
        return self._client

    def async_client(self) -> _AsyncCollection:
        return self.target.async_client()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _AsyncCollection:
    """``async with target.async_client() as client``: an async client on the collection, closed after.
    One per call: an ``httpx.AsyncClient`` belongs to the event loop it was made on, and frameworks
    call their async methods from whichever loop they run."""

    def __init__(self, target: StoreTarget) -> None:
        self._root = target.async_root_client()
        self._view = self._root.collection(target.collection)

    async def __aenter__(self) -> AsyncShardragClient:
        return self._view

    async def __aexit__(self, *exc: object) -> None:
        await self._root.close()


def prepared_vectors(vectors: Sequence[Sequence[float]], distance: str) -> list[list[float]]:
    """The vectors as the collection stores them: unit length for cosine (a zero vector is refused:
    it has no direction)."""
    rows = np.asarray(vectors, dtype=np.float64)
    if rows.size == 0:
        return []
    if rows.ndim != 2:
        raise ValueError(f"expected a list of vectors, got an array of shape {rows.shape}")
    if distance == "cosine":
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        if (norms == 0).any():
            raise ValueError("a zero vector has no cosine similarity to anything")
        rows = rows / norms
    return [[float(x) for x in row] for row in rows]


def _collection_args(dim: int, distance: str, shards: int, replicas: int, factory: str,
                     lexical_language: str | None) -> dict[str, Any]:
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {sorted(DISTANCES)}, got {distance!r}")
    return {"dim": dim, "metric": DISTANCES[distance], "shards": shards, "replicas": replicas, "factory": factory,
            "lexical_language": lexical_language}


def _check_existing(name: str, shown: Mapping[str, Any], dim: int, distance: str) -> None:
    if int(shown.get("dim", dim)) != dim or shown.get("metric", DISTANCES[distance]) != DISTANCES[distance]:
        raise ValueError(f"collection {name!r} exists with dim {shown.get('dim')} and metric {shown.get('metric')}; "
                         f"this store needs dim {dim} and metric {DISTANCES[distance]} ({distance})")


def ensure_collection(admin: ShardragClient, name: str, *, dim: int, distance: str = "cosine", shards: int = 1,
                      replicas: int = 1, factory: str = "Flat", lexical_language: str | None = None) -> None:
    """Create ``name`` unless it exists; an existing one must match ``dim`` and the metric.
    ``lexical_language``: how its lexical and hybrid search analyse texts (None: the gateway's
    default, english; docs/hybrid.md)."""
    args = _collection_args(dim, distance, shards, replicas, factory, lexical_language)
    try:
        admin.create_collection(name, **args)
    except (Conflict, VersionConflict):
        _check_existing(name, admin.get_collection(name), dim, distance)


async def ensure_collection_async(admin: AsyncShardragClient, name: str, *, dim: int, distance: str = "cosine",
                                  shards: int = 1, replicas: int = 1, factory: str = "Flat",
                                  lexical_language: str | None = None) -> None:
    args = _collection_args(dim, distance, shards, replicas, factory, lexical_language)
    try:
        await admin.create_collection(name, **args)
    except (Conflict, VersionConflict):
        _check_existing(name, await admin.get_collection(name), dim, distance)
