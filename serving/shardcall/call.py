"""One call to one shard: pick a replica, hedge if it is slow, retry if it fails.

The call goes to the replica the balancer picks among those in rotation. If no answer has come
after the shard's adaptive hedge delay (and the budget has a token), the same request goes to a
second replica — never one already tried — and the first answer wins; the loser is cancelled
(its connection is closed, so the shard server stops waiting on it). A connection failure or a
5xx sends the request on to an untried replica at once, within the deadline. At most
``max_hedges`` hedges per call.

Hedging never adds load where it cannot help: a hedge goes only to a replica the balancer
expects to answer sooner than the primary has already been waiting (peak-EWMA latency × the
calls queued there — a saturated replica, or a host where every replica queues, expects more),
otherwise the call waits another hedge delay and asks again. Retries after failures spend
tokens from their own bucket (``retry_budget_ratio`` of calls + a burst), so a failing shard
cannot double the traffic either. Every outcome feeds the balancer (latency, load), the outlier
detector (consecutive failures) and the shard's latency window.

Time goes through a :class:`Timer` so tests run on a fake clock without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from httpkit import tracing
from retrieval.bm25 import LexicalQuery
from retrieval.contract import SearchParams
from retrieval.errors import (
    ConfigError,
    DeadlineExceeded,
    ReplicaBehind,
    ShardragError,
    ShardUnavailable,
    VersionConflict,
)
from serving.shardcall.balancer import Balancer
from serving.shardcall.ejection import OutlierDetector
from serving.shardcall.hedging import AdaptiveHedgeDelay, HedgeBudget
from serving.transport.client import ShardClient, ShardReply

logger = logging.getLogger(__name__)


def _consume_outcome(task: asyncio.Future[ShardReply]) -> None:
    """Mark a finished attempt's exception as seen: losers of a hedge race fail silently by design."""
    if not task.cancelled():
        task.exception()


# Failures that say "this replica, now" — worth another replica. A 409 (the replica does not
# hold the version) also sends the call on, and marks the replica not eligible for that version.
# Other errors (4xx: the request itself is wrong) are final.
RETRYABLE = (ShardUnavailable, DeadlineExceeded)


Tasks = set["asyncio.Future[Any]"]


class Timer(Protocol):
    def now(self) -> float: ...

    async def wait_first(self, tasks: Tasks, timeout_s: float) -> Tasks:
        """The finished tasks, as soon as one finishes or ``timeout_s`` passes."""
        ...


class LoopTimer:
    def now(self) -> float:
        return time.monotonic()

    async def wait_first(self, tasks: Tasks, timeout_s: float) -> Tasks:
        if timeout_s <= 0:
            return {task for task in tasks if task.done()}
        done, _ = await asyncio.wait(tasks, timeout=None if math.isinf(timeout_s) else timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        return done


@dataclass(slots=True, frozen=True)
class HedgingSettings:
    enabled: bool = True  # send a second copy of a shard call that is slower than usual
    percentile: float = 95.0  # hedge after this percentile of the shard's recent latencies
    floor_ms: float = 2.0  # ...but never sooner than this
    cap_ms: float = 250.0  # ...and never later than this
    max_hedges: int = 1  # extra copies per shard call (at most replicas - 1 are used)
    budget_ratio: float = 0.05  # hedges add at most this fraction of shard calls...
    budget_burst: float = 10.0  # ...plus this many in a burst
    retry_budget_ratio: float = 0.1  # retries after failures add at most this fraction of calls...
    retry_budget_burst: float = 10.0  # ...plus this many in a burst (a replica killed mid-load)

    @property
    def floor_s(self) -> float:
        return self.floor_ms / 1000.0

    @property
    def cap_s(self) -> float:
        return self.cap_ms / 1000.0

    def validate(self) -> None:
        for name in ("percentile", "floor_ms", "cap_ms", "budget_ratio", "retry_budget_ratio"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"hedging.{name} must be > 0", field=f"hedging.{name}")
        if not self.percentile < 100:
            raise ConfigError("hedging.percentile must be < 100", field="hedging.percentile")
        if self.floor_ms > self.cap_ms:
            raise ConfigError("hedging.floor_ms is above hedging.cap_ms", field="hedging.floor_ms")
        if self.max_hedges < 0:
            raise ConfigError("hedging.max_hedges must be ≥ 0", field="hedging.max_hedges")
        for name in ("budget_burst", "retry_budget_burst"):
            if getattr(self, name) < 0:
                raise ConfigError(f"hedging.{name} must be ≥ 0", field=f"hedging.{name}")


@dataclass(slots=True, frozen=True)
class CallResult:
    reply: ShardReply
    replica: str
    attempts: int  # replicas the request went to (primary + retries + hedges)
    hedged: bool  # a hedge was sent
    hedge_won: bool  # the answer came from a hedge
    latency_ms: float


@dataclass(slots=True)
class CallStats:
    calls: int = 0
    hedges_fired: int = 0
    hedges_won: int = 0
    budget_exhausted: int = 0
    hedges_not_worth: int = 0  # hedge points where no replica was expected to answer sooner
    retries: int = 0
    retries_refused: int = 0  # failures not retried: the retry budget was empty
    failures: int = 0


@dataclass(slots=True)
class _Attempt:
    replica: str
    started: float
    is_hedge: bool


@dataclass
class ShardCaller:
    client: ShardClient
    balancer: Balancer
    detector: OutlierDetector
    hedging: HedgingSettings = field(default_factory=HedgingSettings)
    timer: Timer = field(default_factory=LoopTimer)
    stats: CallStats = field(default_factory=CallStats)
    on_not_eligible: Callable[[str, str], None] | None = None  # (replica, version) that answered 409

    def __post_init__(self) -> None:
        self.budget = HedgeBudget(ratio=self.hedging.budget_ratio, burst=self.hedging.budget_burst)
        self.retry_budget = HedgeBudget(ratio=self.hedging.retry_budget_ratio, burst=self.hedging.retry_budget_burst)
        self._delays: dict[int, AdaptiveHedgeDelay] = {}

    def _worth_hedging(self, target: str, waited_s: float) -> bool:
        """A hedge pays only if ``target`` is expected to answer sooner than the primary has been
        waiting; a replica that is saturated, or a host where every replica queues, expects more."""
        expected_s = self.balancer.expected_latency_s(target)
        return expected_s is None or expected_s < waited_s

    def hedge_delay(self, shard_id: int) -> AdaptiveHedgeDelay:
        delay = self._delays.get(shard_id)
        if delay is None:
            delay = self._delays[shard_id] = AdaptiveHedgeDelay(
                percentile=self.hedging.percentile, floor_s=self.hedging.floor_s, cap_s=self.hedging.cap_s)
        return delay

    async def call(self, shard_id: int, replicas: Sequence[str], vectors: np.ndarray, params: SearchParams,
                   deadline: float, *, lexical: Sequence[LexicalQuery] = ()) -> CallResult:
        """Search ``vectors`` (``params.lexical``: the ``lexical`` queries) on one of ``replicas``
        (those of ``shard_id`` holding ``params.version``)."""
        if not tracing.recording():
            return await self._call(shard_id, replicas, vectors, params, deadline, lexical)
        with tracing.span("shard.call", **{"shardrag.shard": shard_id}) as span:
            result = await self._call(shard_id, replicas, vectors, params, deadline, lexical)
            span.set_attributes({"shardrag.replica": result.replica, "shardrag.attempts": result.attempts,
                                 "shardrag.hedged": result.hedged, "shardrag.hedge_won": result.hedge_won})
            return result

    async def _attempt(self, shard_id: int, replica: str, number: int, is_hedge: bool, vectors: np.ndarray,
                       params: SearchParams, timeout_s: float, lexical: Sequence[LexicalQuery]) -> ShardReply:
        """One try on one replica, as its own span: the first, a retry, or a hedge."""
        kind = "hedge" if is_hedge else ("retry" if number > 1 else "first")
        with tracing.span(f"shard.attempt.{kind}", **{"shardrag.shard": shard_id, "shardrag.replica": replica,
                                                      "shardrag.attempt": number, "shardrag.hedge": is_hedge}):
            return await self.client.search(replica, shard_id, vectors, params, timeout_s, lexical=lexical)

    async def _call(self, shard_id: int, replicas: Sequence[str], vectors: np.ndarray, params: SearchParams,
                    deadline: float, lexical: Sequence[LexicalQuery]) -> CallResult:
        timer = self.timer
        started = timer.now()
        if not replicas:
            raise ShardUnavailable(f"shard {shard_id}: no replica holds version {params.version} ready",
                                   shard=shard_id)
        self.stats.calls += 1
        self.budget.on_call()
        self.retry_budget.on_call()
        window = self.hedge_delay(shard_id)
        tried: list[str] = []
        running: dict[asyncio.Future[ShardReply], _Attempt] = {}
        last_error: Exception | None = None
        hedges = 0
        max_hedges = min(self.hedging.max_hedges, len(replicas) - 1) if self.hedging.enabled else 0

        def pick(is_hedge: bool) -> str | None:
            untried = [r for r in replicas if r not in tried]
            if not untried:
                return None
            healthy = [r for r in untried if not self.detector.is_ejected(r)]
            # A hedge goes only to a replica in rotation; a retry after failures may fall back on
            # an ejected one (better a doubtful answer than none).
            if not healthy and is_hedge:
                return None
            return self.balancer.pick(shard_id, healthy or untried)

        def launch(is_hedge: bool, replica: str | None = None) -> bool:
            replica = replica or pick(is_hedge)
            if replica is None:
                return False
            tried.append(replica)
            self.balancer.on_start(replica)
            remaining_s = max(deadline - timer.now(), 0.001)
            if tracing.recording():
                search = self._attempt(shard_id, replica, len(tried), is_hedge, vectors, params, remaining_s, lexical)
            else:
                search = self.client.search(replica, shard_id, vectors, params, remaining_s, lexical=lexical)
            task = asyncio.ensure_future(search)
            task.add_done_callback(_consume_outcome)
            running[task] = _Attempt(replica, timer.now(), is_hedge)
            return True

        launch(False)
        hedge_at = started + window.delay_s() if max_hedges else math.inf
        try:
            while running:
                now = timer.now()
                if now >= deadline:
                    raise DeadlineExceeded(f"shard {shard_id}: no replica answered before the deadline "
                                           f"(tried {', '.join(tried)})", shard=shard_id)
                done = await timer.wait_first(set(running), min(deadline, hedge_at) - now)
                for task in done:
                    attempt = running.pop(task)
                    latency_s = timer.now() - attempt.started
                    error = task.exception()
                    if error is None:
                        self.balancer.on_finish(attempt.replica, latency_s, ok=True)
                        self.detector.record_success(attempt.replica)
                        window.observe(latency_s)
                        if attempt.is_hedge:
                            self.stats.hedges_won += 1
                        return CallResult(task.result(), attempt.replica, len(tried), hedges > 0, attempt.is_hedge,
                                          (timer.now() - started) * 1000.0)
                    self.balancer.on_finish(attempt.replica, latency_s, ok=False)
                    failed = False  # the replica failed (not merely behind, or without the version)
                    if isinstance(error, ReplicaBehind):
                        pass  # not sick, just behind on writes for a session read: try another replica
                    elif isinstance(error, VersionConflict):
                        # not a sick replica, just one without this version: not eligible, try another
                        if self.on_not_eligible is not None and params.version is not None:
                            self.on_not_eligible(attempt.replica, params.version)
                    elif isinstance(error, RETRYABLE) or not isinstance(error, ShardragError):
                        # an unexpected transport error is the replica's failure, not the query's
                        if not isinstance(error, ShardragError):
                            logger.warning("replica %s failed unexpectedly: %r", attempt.replica, error)
                            error = ShardUnavailable(f"shard {shard_id} ({attempt.replica}) failed: {error!r}",
                                                     shard=shard_id)
                        self.stats.failures += 1
                        self.detector.record_failure(attempt.replica)
                        failed = True
                    else:
                        raise error
                    last_error = error
                    if not running and timer.now() < deadline and (target := pick(False)) is not None:
                        if failed and not self.retry_budget.try_spend():
                            self.stats.retries_refused += 1
                            raise error
                        launch(False, target)
                        self.stats.retries += 1
                if running and timer.now() >= hedge_at:
                    now = timer.now()
                    target = pick(True) if hedges < max_hedges else None
                    if target is None:
                        hedge_at = math.inf  # no healthy untried replica, or no hedges left
                    elif not self._worth_hedging(target, now - started):
                        self.stats.hedges_not_worth += 1
                        hedge_at = now + window.delay_s()  # ask again after another delay
                    elif self.budget.try_spend():
                        launch(True, target)
                        hedges += 1
                        self.stats.hedges_fired += 1
                        hedge_at = now + window.delay_s() if hedges < max_hedges else math.inf
                    else:
                        self.stats.budget_exhausted += 1
                        hedge_at = math.inf
            assert last_error is not None
            if isinstance(last_error, VersionConflict):
                raise ShardUnavailable(f"shard {shard_id}: no replica holds version {params.version} "
                                       f"({last_error.message})", shard=shard_id) from last_error
            raise last_error
        finally:
            for task, attempt in running.items():  # losers and leftovers: cancel, count their time
                task.cancel()
                self.balancer.on_finish(attempt.replica, timer.now() - attempt.started, ok=True)
