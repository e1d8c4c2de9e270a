"""Fan a query out to its shards, collect one answer per shard, merge the global top k.

Each shard has a :class:`~serving.batching.NaturalBatcher`, so concurrent queries with the
same parameters share one call per shard; the call itself (replica choice, hedging, retries)
is :class:`~serving.shard_call.ShardCaller`'s. A shard that has not answered by the query's
deadline, or whose every replica failed, is *missing*: the result says which and why, and the
gateway answers partially or refuses. Replies of an embedding version other than the query's
are refused: results of two versions are never merged.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from retrieval.errors import InvalidRequest, VersionConflict
from retrieval.merge import merge_topk_columns
from retrieval.routing import route_top_m
from retrieval.types import DocId, Hit, ShardId

from serving.batching import NaturalBatcher
from serving.shard_call import RETRYABLE, CallResult, ShardCaller
from serving.topology import Topology
from serving.transport import SearchParams


@dataclass(slots=True, frozen=True)
class ShardCall:
    """How one shard answered one query (diagnostics)."""

    shard_id: int
    version: str
    replica: str
    latency_ms: float
    batch_size: int
    attempts: int
    hedged: bool
    hedge_won: bool


@dataclass(slots=True, frozen=True)
class FanOutResult:
    hits: list[Hit]
    version: str
    shards_total: int
    shards_queried: list[int]
    calls: list[ShardCall]
    missing: dict[int, str]  # shard id → why it is not in the answer

    @property
    def partial(self) -> bool:
        return bool(self.missing)


_Item = tuple[np.ndarray, float]  # (query vector, monotonic deadline)
_Answer = tuple[dict, ShardCall]  # (one query's hit columns, call diagnostics)


Eligible = Callable[[int, str], Sequence[str]]  # (shard id, version) → replicas holding it ready


class FanOut:
    def __init__(
        self,
        shard_replicas: Sequence[Sequence[str]],
        caller: ShardCaller,
        eligible: Eligible,
        *,
        coalesce: bool = True,
        max_batch: int = 64,
        max_inflight_per_replica: int = 2,
        on_call: Callable[[ShardCall], None] | None = None,
    ) -> None:
        self.caller = caller
        self._eligible = eligible
        self._on_call = on_call
        self._batchers: list[NaturalBatcher[SearchParams, _Item, _Answer]] = []
        for shard_id, replicas in enumerate(shard_replicas):
            if coalesce:  # batches never mix versions: the version is part of the batch key
                batcher = NaturalBatcher(self._caller(shard_id), max_batch=max_batch,
                                         max_inflight=max_inflight_per_replica * len(replicas))
            else:  # one call per query, no queueing: the baseline coalescing is measured against
                batcher = NaturalBatcher(self._caller(shard_id), max_batch=1, max_inflight=1 << 30)
            self._batchers.append(batcher)

    @staticmethod
    def targets(vector: np.ndarray, top_m: int | None, topology: Topology) -> list[int]:
        n = topology.num_shards
        if top_m is None or top_m >= n:
            if top_m is not None and top_m > n:
                raise InvalidRequest(f"top_m must be between 1 and {n} (the number of shards)", field="top_m")
            return list(range(n))
        if topology.centroids is None:
            raise InvalidRequest("top_m needs a kmeans-partitioned collection; this one is "
                                 f"{topology.partitioner!r}", field="top_m")
        return [int(s) for s in route_top_m(vector[None, :], topology.centroids, top_m)[0]]

    async def search(self, vector: np.ndarray, params: SearchParams, topology: Topology, *, top_m: int | None,
                     timeout_s: float) -> FanOutResult:
        """``topology`` must be that of ``params.version`` (routing uses its centroids)."""
        targets = self.targets(vector, top_m, topology)
        deadline = time.monotonic() + timeout_s
        futures = [self._batchers[s].submit(params, (vector, deadline)) for s in targets]
        _, pending = await asyncio.wait(futures, timeout=timeout_s)
        answers: list[_Answer] = []
        missing: dict[int, str] = {}
        for shard_id, future in zip(targets, futures):
            if future in pending:
                future.cancel()  # the shard call goes on for the other queries of its batch
                missing[shard_id] = f"no answer within {timeout_s * 1000:.0f} ms"
                continue
            error = future.exception()
            if error is None:
                answers.append(future.result())
            elif isinstance(error, RETRYABLE):
                missing[shard_id] = getattr(error, "message", str(error))
            else:
                raise error  # bad request, version conflict: the query itself is wrong
        return FanOutResult(_merge(answers, params.k), params.version, topology.num_shards, targets,
                            [call for _, call in answers], missing)

    def _caller(self, shard_id: int):
        async def call(params: SearchParams, items: list[_Item]) -> Sequence[_Answer]:
            vectors = np.stack([vector for vector, _ in items])
            deadline = max(item_deadline for _, item_deadline in items)
            replicas = self._eligible(shard_id, params.version)
            result: CallResult = await self.caller.call(shard_id, replicas, vectors, params, deadline)
            if result.reply.version != params.version:  # never merged: the query fails instead
                raise VersionConflict(f"shard {shard_id} answered with version {result.reply.version!r}, "
                                      f"the query is on {params.version!r}", shard=shard_id)
            info = ShardCall(shard_id, result.reply.version, result.replica, result.latency_ms, len(items),
                             result.attempts, result.hedged, result.hedge_won)
            if self._on_call is not None:
                self._on_call(info)
            return [(columns, info) for columns in result.reply.results]

        return call


def _merge(answers: list[_Answer], k: int) -> list[Hit]:
    winners = merge_topk_columns([(columns["doc_ids"], columns["scores"]) for columns, _ in answers], k)
    hits = []
    for a, i in winners:
        columns, call = answers[a]
        hits.append(Hit(DocId(columns["doc_ids"][i]), columns["scores"][i], ShardId(call.shard_id),
                        columns["titles"][i], columns["texts"][i], call.version))
    return hits
