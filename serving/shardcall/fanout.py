"""Fan a query out to its shards, collect one answer per shard, merge the global top k.

A query comes with its :class:`ShardRoute`: the replicas of each shard that hold its embedding
version ready, as one immutable snapshot taken when the query started (so the replica set
cannot change under it), and the centroids for ``top_m`` routing. Each shard has a
:class:`~serving.shardcall.batching.NaturalBatcher`, so concurrent queries with the same
parameters share one call per shard; the call itself (replica choice, hedging, retries) is
:class:`~serving.shardcall.call.ShardCaller`'s. A shard that has not answered by the query's
deadline, or whose every replica failed, is *missing*: the result says which and why, and the
gateway answers partially or refuses. Replies of an embedding version other than the query's
are refused: results of two versions are never merged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from retrieval.contract import HitColumns, SearchParams
from retrieval.errors import ConfigError, InvalidRequest, VersionConflict
from retrieval.merge import merge_topk_columns
from retrieval.routing import route_top_m
from retrieval.types import DocId, Hit, ShardId
from serving.shardcall.batching import NaturalBatcher
from serving.shardcall.call import RETRYABLE, CallResult, ShardCaller


@dataclass(slots=True, frozen=True)
class FanOutSettings:
    transport: str = "pooled"  # gateway→shard client: the pooled HTTP client (the others: benchmarks/transports.py)
    balancer: str = "p2c_peak_ewma"  # replica choice: round_robin, random, least_outstanding, p2c_peak_ewma
    coalesce: bool = True  # batch concurrent queries into one call per shard
    max_batch: int = 64  # most queries per coalesced shard call
    max_inflight_per_replica: int = 2  # concurrent calls per replica before queries queue

    def validate(self) -> None:
        from serving.shardcall.policies import BALANCERS

        if self.transport != "pooled":
            raise ConfigError(f"calls.transport {self.transport!r}: production has one shard client, 'pooled' "
                              "(the aiohttp and httpx clients it was measured against live in "
                              "benchmarks/transports.py)", field="calls.transport")
        if self.balancer not in BALANCERS:
            raise ConfigError(f"unknown balancer {self.balancer!r}; use one of {list(BALANCERS)}",
                              field="calls.balancer")
        for name in ("max_batch", "max_inflight_per_replica"):
            if getattr(self, name) < 1:
                raise ConfigError(f"calls.{name} must be ≥ 1", field=f"calls.{name}")


@dataclass(slots=True, frozen=True)
class ShardRoute:
    """Where queries on one embedding version go: per shard, the replicas that hold it ready."""

    version: str
    replicas: tuple[tuple[str, ...], ...]  # shard id → replicas holding ``version`` ready
    centroids: np.ndarray | None = None  # (num_shards, dim) for kmeans partitions: top_m routing
    partitioner: str = "hash"

    @property
    def num_shards(self) -> int:
        return len(self.replicas)


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


_Item = tuple[np.ndarray, float, tuple[str, ...]]  # (query vector, monotonic deadline, eligible replicas)
_Answer = tuple[HitColumns, ShardCall]  # (one query's hit columns, call diagnostics)


class FanOut:
    def __init__(
        self,
        shard_replicas: Sequence[Sequence[str]],
        caller: ShardCaller,
        *,
        coalesce: bool = True,
        max_batch: int = 64,
        max_inflight_per_replica: int = 2,
        on_call: Callable[[ShardCall], None] | None = None,
    ) -> None:
        """``shard_replicas``: every replica of every shard slot (sizes the in-flight limits)."""
        self.caller = caller
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
    def targets(vector: np.ndarray, top_m: int | None, route: ShardRoute) -> list[int]:
        n = route.num_shards
        if top_m is None or top_m >= n:
            if top_m is not None and top_m > n:
                raise InvalidRequest(f"top_m must be between 1 and {n} (the number of shards)", field="top_m")
            return list(range(n))
        if route.centroids is None:
            raise InvalidRequest("top_m needs a kmeans-partitioned collection; this one is "
                                 f"{route.partitioner!r}", field="top_m")
        return [int(s) for s in route_top_m(vector[None, :], route.centroids, top_m)[0]]

    async def search(self, vector: np.ndarray, params: SearchParams, route: ShardRoute, *, top_m: int | None,
                     timeout_s: float, min_seq: Mapping[int, int] | None = None) -> FanOutResult:
        """``route`` must be that of ``params.version``. ``min_seq``: per shard, the write a replica
        must have applied to answer (session reads)."""
        targets = self.targets(vector, top_m, route)
        deadline = time.monotonic() + timeout_s
        futures = [self._batchers[s].submit(replace(params, min_seq=min_seq[s]) if min_seq and s in min_seq else params,
                                            (vector, deadline, route.replicas[s])) for s in targets]
        _, pending = await asyncio.wait(futures, timeout=timeout_s)
        answers: list[_Answer] = []
        missing: dict[int, str] = {}
        for shard_id, future in zip(targets, futures, strict=True):
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
        return FanOutResult(_merge(answers, params.k), route.version, route.num_shards, targets,
                            [call for _, call in answers], missing)

    def _caller(self, shard_id: int) -> Callable[[SearchParams, list[_Item]], Awaitable[Sequence[_Answer]]]:
        async def call(params: SearchParams, items: list[_Item]) -> Sequence[_Answer]:
            vectors = np.stack([vector for vector, _, _ in items])
            deadline = max(item_deadline for _, item_deadline, _ in items)
            replicas = items[0][2]  # one version per batch: every item's snapshot names its replicas
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
        metadata = columns.get("metadata")
        hits.append(Hit(DocId(columns["doc_ids"][i]), columns["scores"][i], ShardId(call.shard_id),
                        columns["titles"][i], columns["texts"][i], call.version,
                        metadata[i] if metadata is not None else None))
    return hits
