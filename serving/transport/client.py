"""The shard client: what the gateway can ask a shard replica, typed, whatever the wire.

:class:`ShardClient` is the seam between the gateway and the shards (httpx's
``BaseTransport.handle_request`` is the model): balancing, hedging, fan-out and the version
protocol above it never see HTTP or Ray. Implementations map their failures onto the error tree
at this boundary: an unreachable replica → ShardUnavailable, a missed deadline →
DeadlineExceeded, a replica's own error answer → :func:`retrieval.errors.error_for_status`
(409 → VersionConflict, 4xx → the request's error, 5xx → ShardUnavailable).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.bm25 import CorpusStats, LexicalQuery
from retrieval.contract import (
    HealthInfo,
    HitColumns,
    ReplicaInfo,
    SearchParams,
    StageReply,
    UnloadReply,
    WriteReply,
)
from retrieval.records import ScanPage


@dataclass(slots=True, frozen=True)
class ShardReply:
    """One replica's answer to one search call, as the caller saw it."""

    shard_id: int
    version: str
    replica: str
    results: list[HitColumns]  # per query vector, best first
    latency_ms: float  # the call as the caller timed it: wire, queueing and search
    server_ms: float = 0.0  # the search alone, as the replica timed it (0 where it does not say)
    stats: list[CorpusStats] | None = None  # a lexical search: per query, the replica's statistics for its terms
    dense: list[HitColumns] | None = None  # a hybrid call: per query, its vector's top k


class ShardClient(ABC):
    @abstractmethod
    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float, *, lexical: Sequence[LexicalQuery] = ()) -> ShardReply:
        """Top-k of each row of ``vectors`` on ``replica`` (which serves ``shard_id``); with
        ``params.lexical``, the BM25 top k of each of ``lexical`` instead, each with the replica's
        statistics for its terms (``ShardReply.stats``), and when ``vectors`` has one row per
        lexical query (a hybrid call), each row's top k too (``ShardReply.dense``)."""

    @abstractmethod
    async def info(self, replica: str, timeout_s: float) -> ReplicaInfo:
        """The versions the replica holds, with their state and details."""

    @abstractmethod
    async def health(self, replica: str, timeout_s: float) -> HealthInfo:
        """Liveness: raises when the replica does not answer."""

    @abstractmethod
    async def stage(self, replica: str, version: str, timeout_s: float) -> StageReply:
        """Ask the replica to load ``version`` next to what it holds (idempotent)."""

    @abstractmethod
    async def unload(self, replica: str, version: str, timeout_s: float) -> UnloadReply:
        """Ask the replica to drop ``version`` (idempotent)."""

    # The write path: every transport carries all of it (a method that failed at run time on one
    # transport would be a seam with a hole).
    @abstractmethod
    async def primary_write(self, replica: str, shard_id: int, version: str, records: bytes, ack: str,
                            generation: int, timeout_s: float) -> WriteReply:
        """Send a batch (``retrieval.records`` framing, no seqs) to the shard's primary, which
        numbers, replicates and acknowledges it (``index_shards.primary``)."""

    @abstractmethod
    async def writes_after(self, replica: str, version: str, after_seq: int, timeout_s: float) -> bytes:
        """The replica's write records after ``after_seq`` (NotFound: no longer in its log)."""

    @abstractmethod
    async def snapshot(self, replica: str, version: str, timeout_s: float) -> bytes:
        """Every live document of ``version`` on the replica (``retrieval.records.Snapshot`` bytes)."""

    @abstractmethod
    async def fence(self, replica: str, generation: int, hold_s: float, timeout_s: float) -> dict[str, Any]:
        """Make the replica refuse writes sent under a rollout generation older than ``generation``
        for ``hold_s`` seconds; its applied seq per version and whether it is the primary."""

    @abstractmethod
    async def document(self, replica: str, shard_id: int, version: str, doc_id: str,
                       timeout_s: float) -> dict[str, Any] | None:
        """The document as the replica holds it, or None (absent or deleted)."""

    @abstractmethod
    async def matching_ids(self, replica: str, shard_id: int, version: str, filter_canonical: str, limit: int,
                           timeout_s: float) -> list[str]:
        """Ids of the replica's live documents that the filter (canonical JSON) selects."""

    @abstractmethod
    async def scan(self, replica: str, shard_id: int, version: str, filter_canonical: str, after: str, limit: int,
                   timeout_s: float) -> ScanPage:
        """How many live documents of the replica the filter (canonical JSON) selects, and the first
        ``limit`` of them (0: the count alone) in id order after ``after`` ("": from the first)."""

    # -- tuning (POST /v1/collections/{name}/tune: index_shards.live_tuning) ------------------------
    @abstractmethod
    async def tune_sample(self, replica: str, version: str, count: int, seed: int, timeout_s: float) -> bytes:
        """``count`` stored vectors of the replica's base as pseudo-queries, with their ids
        (``retrieval.tuning_choice.encode_queries`` bytes)."""

    @abstractmethod
    async def tune_evaluate(self, replica: str, version: str, queries: bytes, k: int, max_value: int | None,
                            timeout_s: float) -> bytes:
        """The base's exact and per-candidate answers to ``queries`` (``encode_queries`` bytes), as
        ``retrieval.tuning_choice.encode_result`` bytes."""

    @abstractmethod
    async def set_search_defaults(self, replica: str, version: str, defaults: dict[str, Any],
                                  timeout_s: float) -> dict[str, Any]:
        """Keep and apply tuned search defaults (``index_shards.search_defaults.SearchDefaults`` fields)."""

    async def close(self) -> None:  # noqa: B027 - optional: only clients that hold resources close them
        pass
