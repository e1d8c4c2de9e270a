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
import functools
import math
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from httpkit import tracing
from retrieval.analysis import DEFAULT_LANGUAGE
from retrieval.contract import HitColumns, SearchParams, SessionFloor
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
    # Per-shard top-k trimming (Vespa's top-k probability): each of n shards is asked for
    # k/n + z·sqrt(k·(1/n)·(1−1/n)) hits, z the normal quantile of this probability; 0 turns it off.
    topk_probability: float = 0.9999

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
        if self.topk_probability != 0 and not 0.5 <= self.topk_probability < 1:
            raise ConfigError("calls.topk_probability must be in [0.5, 1) (0: ask every shard for the full k)",
                              field="calls.topk_probability")


@functools.lru_cache(maxsize=1024)  # on every query's path: a handful of (k, n, p) in practice
def trimmed_k(k: int, shards: int, probability: float) -> int:
    """How many hits to ask each of ``shards`` shards for so that, with documents spread evenly
    (hash partitions), a shard holds more than that many of the global top ``k`` with probability
    about 1 − ``probability`` (a binomial(k, 1/n) tail, normal approximation). ``k`` when trimming
    does not apply (one shard, probability 0)."""
    if shards <= 1 or probability == 0:
        return k
    z = statistics.NormalDist().inv_cdf(probability)
    p = 1.0 / shards
    return min(k, max(1, math.ceil(k * p + z * math.sqrt(k * p * (1.0 - p)))))


_REFINE = re.compile(r"(^|,)(Refine\(|RFlat)", re.IGNORECASE)


def trimming_blocker(factory: str) -> str | None:
    """Why per-shard top-k trimming can never equal the full-k answer on shards of ``factory``
    (None: it can). Measured on real FAISS indexes (tests/unit/serving/test_trimming_rules.py): on a
    refined index a shard's top k′ is not the first k′ of its top k, so a trimmed first round would
    return different hits, not just fewer. (Fast-scan PQ differs only in the order of equal scores
    and in which of the hits tied at the last score it keeps: the merge orders by score then id,
    and such a shard is asked again for the full k, so trimming stays exact there.)"""
    if _REFINE.search(factory):
        return (f"{factory}: a refined index re-ranks k_factor × k candidates, so asking a shard for fewer "
                "hits re-ranks fewer and can change which come first")
    return None


@dataclass(slots=True, frozen=True)
class ShardRoute:
    """Where queries on one embedding version go: per shard, the replicas that hold it ready."""

    version: str
    replicas: tuple[tuple[str, ...], ...]  # shard id → replicas holding ``version`` ready
    centroids: np.ndarray | None = None  # (num_shards, dim) for kmeans partitions: top_m routing
    partitioner: str = "hash"
    # HNSW searches with a beam of max(efSearch, k): asking a shard for fewer hits narrows it, so
    # a shorter list would not be a prefix of the full one. Trimming needs an explicit ef_search ≥ k.
    k_shapes_search: bool = False
    # Factories on which no trimmed list is a prefix of the full one (trimming_blocker): never trimmed.
    trimming_blocked: str | None = None
    lexical_language: str = DEFAULT_LANGUAGE  # how the shards analyse a lexical query's text

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
    server_ms: float  # the replica's own search time; latency_ms minus this is the hop
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
    asked_k: int = 0  # hits asked of each shard in the first round (< k: trimmed)
    second_round: tuple[int, ...] = ()  # shards asked again for the full k
    trimming: str = "off"  # "on", or why each shard was asked for the full k

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
        topk_probability: float = 0.0,
        on_call: Callable[[ShardCall], None] | None = None,
    ) -> None:
        """``shard_replicas``: every replica of every shard slot (sizes the in-flight limits)."""
        self.caller = caller
        self.topk_probability = topk_probability
        self._on_call = on_call
        self._batch_limits = [(max_batch, max_inflight_per_replica * len(replicas)) if coalesce
                              else (1, 1 << 30)  # one call per query, no queueing: coalescing's baseline
                              for replicas in shard_replicas]
        # batches never mix versions: the version is part of the batch key
        self._batchers: list[NaturalBatcher[SearchParams, _Item, _Answer]] = self.batchers(self._caller)

    def record(self, call: ShardCall) -> None:
        """Report one shard call (a coalesced batch counts once) to the gateway's metrics: every
        call of every mode — dense, lexical, hybrid — comes through here."""
        if self._on_call is not None:
            self._on_call(call)

    def batchers(self, caller: Callable[[int], Callable[[SearchParams, list[Any]], Awaitable[Sequence[Any]]]],
                 ) -> list[NaturalBatcher[SearchParams, Any, Any]]:
        """One batcher per shard around ``caller(shard_id)``, with this fan-out's batch limits (the
        lexical leg batches its calls the same way)."""
        return [NaturalBatcher(caller(shard_id), max_batch=size, max_inflight=inflight)
                for shard_id, (size, inflight) in enumerate(self._batch_limits)]

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
                     timeout_s: float, session: Mapping[int, SessionFloor] | None = None,
                     exact: bool = False) -> FanOutResult:
        """``route`` must be that of ``params.version``. ``session``: per shard, the write a replica
        must hold to answer (session reads). Unless ``exact``, each shard is first asked for
        :func:`trimmed_k` hits; a shard whose last hit could still be in the global top k (its
        lowest score ≥ the merged k-th, or fewer than k merged) is asked again for the full k, so
        the answer is always the full-k fan-out's."""
        targets = self.targets(vector, top_m, route)
        deadline = time.monotonic() + timeout_s
        trimming = self._trimming(params, route, exact, len(targets))
        asked = trimmed_k(params.k, len(targets), self.topk_probability) if trimming == "on" else params.k
        if trimming == "on" and asked >= params.k:
            trimming = "off: the binomial bound asks each shard for the whole k"
        first = replace(params, k=asked) if asked < params.k else params
        answers, missing = await self._round(vector, first, route, targets, deadline, timeout_s, session)
        ordered = [answers[s] for s in targets if s in answers]
        with tracing.span("merge", **{"shardrag.answers": len(ordered)}):
            merged = merge_answers(ordered, params.k)  # ties break by doc id: the order of answers does not matter
        again: list[int] = []
        if asked < params.k:
            kth = merged[-1].score if len(merged) == params.k else None
            again = [shard for shard, (columns, _) in answers.items()
                     if len(columns["scores"]) >= asked and (kth is None or min(columns["scores"]) >= kth)]
            if again:
                more, failed = await self._round(vector, params, route, again, deadline,
                                                 max(deadline - time.monotonic(), 0.0), session)
                for shard in again:  # a shard without its full answer is missing, not inexact
                    answers.pop(shard)
                answers.update(more)
                missing.update(failed)
                ordered = [answers[s] for s in targets if s in answers]
                merged = merge_answers(ordered, params.k)
        return FanOutResult(merged, route.version, route.num_shards, targets, [call for _, call in ordered], missing,
                            asked, tuple(again), trimming)

    def _trimming(self, params: SearchParams, route: ShardRoute, exact: bool, shards: int) -> str:
        """"on", or why this query's shards are asked for the full k (shown in its diagnostics)."""
        if exact:
            return "off: exact asked for"
        if self.topk_probability == 0:
            return "off: calls.topk_probability is 0"
        if shards <= 1:
            return "off: one shard queried"
        if route.trimming_blocked is not None:
            return f"off: {route.trimming_blocked}"
        if route.k_shapes_search and (params.ef_search or 0) < params.k:
            return "off: HNSW searches a beam of max(ef_search, k): trimmed only with an explicit ef_search ≥ k"
        return "on"

    async def _round(self, vector: np.ndarray, params: SearchParams, route: ShardRoute, targets: list[int],
                     deadline: float, timeout_s: float,
                     session: Mapping[int, SessionFloor] | None) -> tuple[dict[int, _Answer], dict[int, str]]:
        """One call per target shard (coalesced with other queries): the answers and the missing."""
        futures = [self._batchers[s].submit(floored(params, session.get(s) if session else None),
                                            (vector, deadline, route.replicas[s])) for s in targets]
        # a cancelled future's shard call goes on for the other queries of its batch
        return await settle(dict(zip(targets, futures, strict=True)), timeout_s)

    def _caller(self, shard_id: int) -> Callable[[SearchParams, list[_Item]], Awaitable[Sequence[_Answer]]]:
        async def call(params: SearchParams, items: list[_Item]) -> Sequence[_Answer]:
            vectors = np.stack([vector for vector, _, _ in items])
            deadline = max(item_deadline for _, item_deadline, _ in items)
            replicas = items[0][2]  # one version per batch: every item's snapshot names its replicas
            result: CallResult = await self.caller.call(shard_id, replicas, vectors, params, deadline)
            if result.reply.version != params.version:  # never merged: the query fails instead
                raise VersionConflict(f"shard {shard_id} answered with version {result.reply.version!r}, "
                                      f"the query is on {params.version!r}", shard=shard_id)
            info = ShardCall(shard_id, result.reply.version, result.replica, result.latency_ms,
                             result.reply.server_ms, len(items),
                             result.attempts, result.hedged, result.hedge_won)
            self.record(info)
            return [(columns, info) for columns in result.reply.results]

        return call


T = TypeVar("T")


async def settle(futures: Mapping[int, asyncio.Future[T]], timeout_s: float) -> tuple[dict[int, T], dict[int, str]]:
    """Wait up to ``timeout_s`` for one future per shard: the answers, and per shard that has none
    why it is missing (no answer in time: cancelled; a failure of its replicas). An error that is
    the query's own (bad request, version conflict) is raised."""
    if futures and timeout_s > 0:
        _, pending = await asyncio.wait(futures.values(), timeout=timeout_s)
    else:
        pending = {f for f in futures.values() if not f.done()}
    answers: dict[int, T] = {}
    missing: dict[int, str] = {}
    for shard_id, future in futures.items():
        if future in pending:
            future.cancel()
            missing[shard_id] = f"no answer within {max(timeout_s, 0.0) * 1000:.0f} ms"
            continue
        error = future.exception()
        if error is None:
            answers[shard_id] = future.result()
        elif isinstance(error, RETRYABLE):
            missing[shard_id] = getattr(error, "message", str(error))
        else:
            raise error  # bad request, version conflict: the query itself is wrong
    return answers, missing


def floored(params: SearchParams, floor: SessionFloor | None) -> SearchParams:
    """``params`` for one shard of a session read (unchanged for an eventual one)."""
    return params if floor is None else replace(params, min_seq=floor.seq, min_term=floor.term)


def merge_answers(answers: list[_Answer], k: int) -> list[Hit]:
    winners = merge_topk_columns([(columns["doc_ids"], columns["scores"]) for columns, _ in answers], k)
    hits = []
    for a, i in winners:
        columns, call = answers[a]
        metadata = columns.get("metadata")
        hits.append(Hit(DocId(columns["doc_ids"][i]), columns["scores"][i], ShardId(call.shard_id),
                        columns["titles"][i], columns["texts"][i], call.version,
                        metadata[i] if metadata is not None else None))
    return hits
