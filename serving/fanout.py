"""Fan a query out to its shards, collect one answer per shard, merge the global top k.

Each shard has a :class:`~serving.batching.NaturalBatcher`, so concurrent queries with the
same parameters share one call per shard; the call picks a replica through the balancer and,
when a replica cannot be reached, retries on another one within the deadline. Replies of an
embedding version other than the query's are refused: results of two versions are never merged.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from retrieval.errors import DeadlineExceeded, InvalidRequest, ShardUnavailable, VersionConflict
from retrieval.merge import merge_topk_columns
from retrieval.routing import route_top_m
from retrieval.types import DocId, Hit, ShardId

from serving.balancer import Balancer
from serving.batching import NaturalBatcher
from serving.topology import ShardInfo, Topology
from serving.transport import SearchParams, ShardTransport


@dataclass(slots=True, frozen=True)
class ShardCall:
    """How one shard answered one query (diagnostics)."""

    shard_id: int
    replica: str
    latency_ms: float
    batch_size: int
    attempts: int


@dataclass(slots=True, frozen=True)
class FanOutResult:
    hits: list[Hit]
    version: str
    shards_total: int
    shards_queried: list[int]
    calls: list[ShardCall]


_Item = tuple[np.ndarray, float]  # (query vector, monotonic deadline)
_Answer = tuple[dict, ShardCall]  # (one query's hit columns, call diagnostics)


class FanOut:
    def __init__(
        self,
        topology: Topology,
        transport: ShardTransport,
        balancer: Balancer,
        *,
        coalesce: bool = True,
        max_batch: int = 64,
        max_inflight_per_replica: int = 2,
        on_call: Callable[[ShardCall], None] | None = None,
    ) -> None:
        self.topology = topology
        self._on_call = on_call
        self._transport = transport
        self._balancer = balancer
        self._batchers: list[NaturalBatcher[SearchParams, _Item, _Answer]] = []
        for shard in topology.shards:
            if coalesce:
                batcher = NaturalBatcher(self._caller(shard), max_batch=max_batch,
                                         max_inflight=max_inflight_per_replica * len(shard.replicas))
            else:  # one call per query, no queueing: the baseline coalescing is measured against
                batcher = NaturalBatcher(self._caller(shard), max_batch=1, max_inflight=1 << 30)
            self._batchers.append(batcher)

    def targets(self, vector: np.ndarray, top_m: int | None) -> list[int]:
        n = self.topology.num_shards
        if top_m is None or top_m >= n:
            if top_m is not None and top_m > n:
                raise InvalidRequest(f"top_m must be between 1 and {n} (the number of shards)", field="top_m")
            return list(range(n))
        if self.topology.centroids is None:
            raise InvalidRequest("top_m needs a kmeans-partitioned collection; this one is "
                                 f"{self.topology.partitioner!r}", field="top_m")
        return [int(s) for s in route_top_m(vector[None, :], self.topology.centroids, top_m)[0]]

    async def search(self, vector: np.ndarray, params: SearchParams, *, top_m: int | None, timeout_s: float) -> FanOutResult:
        targets = self.targets(vector, top_m)
        deadline = time.monotonic() + timeout_s
        futures = [self._batchers[s].submit(params, (vector, deadline)) for s in targets]
        done, pending = await asyncio.wait(futures, timeout=timeout_s)
        if pending:
            for future in pending:
                future.cancel()
            missing = sorted(s for s, f in zip(targets, futures) if f in pending)
            raise DeadlineExceeded(f"no answer from shards {missing} within {timeout_s * 1000:.0f} ms",
                                   shard=missing[0])
        answers = [future.result() for future in futures]  # re-raises a shard's error
        return FanOutResult(_merge(answers, params.k), params.version, self.topology.num_shards, targets,
                            [call for _, call in answers])

    def _caller(self, shard: ShardInfo):
        async def call(params: SearchParams, items: list[_Item]) -> Sequence[_Answer]:
            vectors = np.stack([vector for vector, _ in items])
            deadline = max(item_deadline for _, item_deadline in items)
            tried: list[str] = []
            while True:
                replica = self._balancer.pick(shard.shard_id, shard.replicas, exclude=tried)
                tried.append(replica)
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise DeadlineExceeded(f"shard {shard.shard_id}: deadline passed before a replica answered",
                                           shard=shard.shard_id)
                self._balancer.on_start(replica)
                started = time.perf_counter()
                try:
                    reply = await self._transport.search(replica, shard.shard_id, vectors, params, remaining_s)
                except ShardUnavailable:
                    self._balancer.on_finish(replica, time.perf_counter() - started, ok=False)
                    if len(set(tried)) >= len(shard.replicas):
                        raise
                    continue  # connection-level failure: another replica, same deadline
                except BaseException:
                    self._balancer.on_finish(replica, time.perf_counter() - started, ok=False)
                    raise
                self._balancer.on_finish(replica, time.perf_counter() - started, ok=True)
                break
            if reply.version != params.version:
                raise VersionConflict(f"shard {shard.shard_id} answered with version {reply.version!r}, "
                                      f"the query is on {params.version!r}", shard=shard.shard_id)
            info = ShardCall(shard.shard_id, reply.replica, reply.latency_ms, len(items), len(tried))
            if self._on_call is not None:
                self._on_call(info)
            return [(columns, info) for columns in reply.results]

        return call


def _merge(answers: list[_Answer], k: int) -> list[Hit]:
    winners = merge_topk_columns([(columns["doc_ids"], columns["scores"]) for columns, _ in answers], k)
    hits = []
    for a, i in winners:
        columns, call = answers[a]
        hits.append(Hit(DocId(columns["doc_ids"][i]), columns["scores"][i], ShardId(call.shard_id),
                        columns["titles"][i], columns["texts"][i]))
    return hits
