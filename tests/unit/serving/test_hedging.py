"""Adaptive hedge delay, hedge budget, and the hedged/retried shard call on a fake clock and a
fake transport (nothing sleeps)."""

import asyncio
import random

import numpy as np
import pytest

from retrieval.contract import SearchParams
from retrieval.errors import DeadlineExceeded, InvalidRequest, ShardUnavailable, VersionConflict
from serving.shardcall.balancer import RoundRobinBalancer
from serving.shardcall.call import HedgingSettings, ShardCaller
from serving.shardcall.ejection import OutlierDetector
from serving.shardcall.hedging import AdaptiveHedgeDelay, HedgeBudget
from tests.unit.serving.fakes import Clock, FakeShardClient, FakeTimer, settle

PARAMS = SearchParams(k=1, version="v1")
VECTORS = np.zeros((1, 4), dtype=np.float32)


def test_delay_is_capped_until_enough_samples_then_tracks_the_percentile():
    delay = AdaptiveHedgeDelay(percentile=95.0, floor_s=0.002, cap_s=0.5, min_samples=20, window=100)
    assert delay.delay_s() == 0.5
    for ms in range(1, 21):  # 1..20 ms
        delay.observe(ms / 1000)
    assert delay.delay_s() == pytest.approx(0.019)  # nearest rank: 19 of 20 samples ≤ 19 ms
    for _ in range(200):
        delay.observe(0.0001)  # very fast shard: the floor holds
    assert delay.delay_s() == 0.002
    for _ in range(200):
        delay.observe(2.0)  # very slow shard: the cap holds
    assert delay.delay_s() == 0.5


def test_delay_window_forgets_old_samples():
    delay = AdaptiveHedgeDelay(percentile=50.0, floor_s=0.0001, cap_s=1.0, min_samples=4, window=8, refresh_every=1)
    for _ in range(8):
        delay.observe(0.1)
    for _ in range(8):
        delay.observe(0.01)
    assert delay.delay_s() == pytest.approx(0.01)


def test_budget_caps_hedges_at_the_ratio_plus_burst():
    budget = HedgeBudget(ratio=0.05, burst=2.0)
    granted = 0
    for _ in range(1000):
        budget.on_call()
        granted += budget.try_spend()  # a hedge wanted on every call
    assert granted <= 0.05 * 1000 + 2 and granted >= 0.05 * 1000 - 1
    assert budget.refused == 1000 - granted


def make_caller(replicas=("r0", "r1"), **hedging):
    transport = FakeShardClient()
    timer = FakeTimer()
    detector = OutlierDetector(consecutive_failures=2, clock=Clock())
    settings = HedgingSettings(**{"cap_ms": 100.0, "floor_ms": 1.0, **hedging})
    not_eligible = []
    caller = ShardCaller(transport, RoundRobinBalancer(rng=random.Random(0)), detector, settings, timer,
                         on_not_eligible=lambda replica, version: not_eligible.append((replica, version)))
    caller.not_eligible = not_eligible
    return caller, transport, timer, tuple(replicas)  # the eligible replicas of shard 0


def run(scenario):
    asyncio.run(scenario())


def test_fast_answer_sends_no_hedge():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        await timer.advance(0.05)
        transport.answer(0)
        result = await task
        assert len(transport.calls) == 1 and not result.hedged and result.attempts == 1
        assert caller.stats.hedges_fired == 0

    run(scenario)


def test_slow_primary_is_hedged_and_the_hedge_wins():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        await timer.advance(0.099)
        assert len(transport.calls) == 1  # not yet: the delay (cap before samples) is 100 ms
        await timer.advance(0.002)
        assert [c.replica for c in transport.calls] == ["r0", "r1"]
        transport.answer(1)
        result = await task
        await settle()
        assert result.hedged and result.hedge_won and result.replica == "r1"
        assert transport.calls[0].cancelled  # the loser is cancelled
        assert (caller.stats.hedges_fired, caller.stats.hedges_won) == (1, 1)

    run(scenario)


def test_primary_can_still_win_after_a_hedge():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        await timer.advance(0.2)
        transport.answer(0)
        result = await task
        await settle()
        assert result.hedged and not result.hedge_won and result.replica == "r0"
        assert transport.calls[1].cancelled

    run(scenario)


def test_no_budget_no_hedge():
    async def scenario():
        caller, transport, timer, shard = make_caller(budget_ratio=0.0, budget_burst=0.0)
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        await timer.advance(0.5)
        assert len(transport.calls) == 1
        transport.answer(0)
        assert not (await task).hedged
        assert caller.stats.budget_exhausted == 1

    run(scenario)


def test_hedging_off_never_hedges():
    async def scenario():
        caller, transport, timer, shard = make_caller(enabled=False)
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        await timer.advance(0.9)
        transport.answer(0)
        assert not (await task).hedged and len(transport.calls) == 1

    run(scenario)


def test_at_most_max_hedges_each_after_a_delay():
    async def scenario():
        caller, transport, timer, shard = make_caller(replicas=("r0", "r1", "r2", "r3"), max_hedges=2)
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=5.0))
        await settle()
        await timer.advance(0.11)
        assert len(transport.calls) == 2
        await timer.advance(0.11)
        assert len(transport.calls) == 3
        await timer.advance(1.0)
        assert len(transport.calls) == 3  # max_hedges = 2
        assert len({c.replica for c in transport.calls}) == 3  # never the same replica twice
        transport.answer(2)
        assert (await task).hedge_won

    run(scenario)


def test_connection_failure_retries_on_another_replica_at_once():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(0, ShardUnavailable("refused", shard=0))
        await settle()
        assert [c.replica for c in transport.calls] == ["r0", "r1"] and timer.now() == 0.0
        transport.answer(1)
        result = await task
        assert result.replica == "r1" and result.attempts == 2 and not result.hedged
        assert caller.stats.retries == 1

    run(scenario)


def test_every_replica_failing_raises_the_last_error():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(0, ShardUnavailable("refused", shard=0))
        await settle()
        transport.fail(1, ShardUnavailable("reset", shard=0))
        with pytest.raises(ShardUnavailable, match="reset"):
            await task

    run(scenario)


def test_a_replica_without_the_version_is_skipped_and_marked_not_eligible():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(0, VersionConflict("holds v2 only", shard=0))
        await settle()
        transport.answer(1)
        result = await task
        assert result.replica == "r1" and caller.not_eligible == [("r0", "v1")]
        assert not caller.detector.is_ejected("r0") and caller.stats.failures == 0  # not a sick replica
        # when no replica holds the version the shard is unavailable (a missing shard, never mixed in)
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(2, VersionConflict("holds v2 only", shard=0))
        await settle()
        transport.fail(3, VersionConflict("holds v2 only", shard=0))
        with pytest.raises(ShardUnavailable, match="no replica holds version v1"):
            await task

    run(scenario)


def test_a_bad_request_is_final_not_retried():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(0, InvalidRequest("nprobe does not apply", field="nprobe"))
        with pytest.raises(InvalidRequest):
            await task
        assert len(transport.calls) == 1

    run(scenario)


def test_deadline_cancels_everything():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=0.3))
        await settle()
        await timer.advance(0.2)
        await timer.advance(0.2)
        with pytest.raises(DeadlineExceeded):
            await task
        await settle()
        assert all(c.cancelled for c in transport.calls) and len(transport.calls) == 2

    run(scenario)


def test_an_ejected_replica_is_not_tried_while_a_healthy_one_exists():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        caller.detector.record_failure("r0")
        caller.detector.record_failure("r0")
        assert caller.detector.is_ejected("r0")
        for _ in range(4):
            task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=timer.now() + 1.0))
            await settle()
            transport.answer(len(transport.calls) - 1)
            await task
        assert {c.replica for c in transport.calls} == {"r1"}
        # a hedge never goes to the ejected replica either: with one healthy replica there is none
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=timer.now() + 1.0))
        await settle()
        await timer.advance(0.5)
        assert len(transport.calls) == 5 and transport.calls[-1].replica == "r1"
        transport.answer(4)
        assert not (await task).hedged
        # a retry after the healthy replica failed may still fall back on the ejected one
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=timer.now() + 1.0))
        await settle()
        transport.fail(5, ShardUnavailable("reset", shard=0))
        await settle()
        assert transport.calls[6].replica == "r0"
        transport.answer(6)
        assert (await task).attempts == 2

    run(scenario)


def test_hedge_delay_adapts_to_observed_latency():
    async def scenario():
        caller, transport, timer, shard = make_caller()
        for i in range(40):  # answered after 5..9 ms
            task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=timer.now() + 1.0))
            await settle()
            await timer.advance(0.005 + 0.001 * (i % 5))
            transport.answer(len(transport.calls) - 1)
            await task
        assert caller.hedge_delay(0).delay_s() == pytest.approx(0.009)  # p95 of the samples
        fired = caller.stats.hedges_fired
        # a call faster than p95 is not hedged...
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=timer.now() + 1.0))
        await settle()
        await timer.advance(0.008)
        transport.answer(len(transport.calls) - 1)
        assert not (await task).hedged and caller.stats.hedges_fired == fired
        # ...a slower one is hedged at 9 ms, not at the 100 ms cap
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=timer.now() + 1.0))
        await settle()
        await timer.advance(0.0085)
        assert caller.stats.hedges_fired == fired
        await timer.advance(0.001)
        assert caller.stats.hedges_fired == fired + 1
        transport.answer(len(transport.calls) - 1)
        assert (await task).hedge_won

    run(scenario)


def make_ewma_caller(latencies_s: dict[str, float], **hedging):
    """A caller whose p2c peak-EWMA balancer already measured each replica at the given latency
    (balancer and caller share one virtual clock)."""
    from serving.shardcall.p2c_peak_ewma import PeakEwmaBalancer

    transport = FakeShardClient()
    timer = FakeTimer()
    balancer = PeakEwmaBalancer(clock=timer.now, rng=random.Random(0))
    for replica, latency_s in latencies_s.items():
        balancer.on_start(replica)
        balancer.on_finish(replica, latency_s, ok=True)
    settings = HedgingSettings(**{"cap_ms": 100.0, "floor_ms": 1.0, **hedging})
    caller = ShardCaller(transport, balancer, OutlierDetector(consecutive_failures=2, clock=Clock()), settings, timer)
    return caller, transport, timer, tuple(latencies_s)


def test_no_hedge_to_a_replica_expected_slower_than_the_wait_so_far():
    """S2-like: the other replica is known to take 500 ms; hedging a call that has waited 100 ms
    there only adds load. The call asks again after each hedge delay, and never spends budget."""

    async def scenario():
        caller, transport, timer, shard = make_ewma_caller({"fast": 0.002, "slow": 0.5})
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        assert [c.replica for c in transport.calls] == ["fast"]  # p2c: the cheaper one
        await timer.advance(0.1)  # the hedge point (cap: no latency samples yet)
        await timer.advance(0.1)  # asked again: still not worth it
        assert len(transport.calls) == 1 and caller.stats.hedges_not_worth == 2
        assert caller.stats.hedges_fired == 0 and caller.budget.spent == 0
        transport.answer(0)
        result = await task
        assert result.replica == "fast" and not result.hedged

    run(scenario)


def test_a_hedge_goes_once_the_wait_exceeds_what_the_other_replica_needs():
    async def scenario():
        caller, transport, timer, shard = make_ewma_caller({"a": 0.002, "b": 0.15})
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        assert [c.replica for c in transport.calls] == ["a"]
        await timer.advance(0.1)  # waited 100 ms, b expects ~150 ms: not yet
        assert len(transport.calls) == 1 and caller.stats.hedges_not_worth == 1
        await timer.advance(0.1)  # waited 200 ms: b is now expected to answer sooner
        assert [c.replica for c in transport.calls] == ["a", "b"] and caller.stats.hedges_fired == 1
        transport.answer(1)
        result = await task
        assert result.hedge_won and result.replica == "b"

    run(scenario)


def test_a_saturated_replica_gets_no_hedge():
    """Same latency estimate, but 60 calls already queued there: expected ≈ 61 × 2 ms > 100 ms."""

    async def scenario():
        caller, transport, timer, shard = make_ewma_caller({"a": 0.002, "b": 0.002})
        for _ in range(60):
            caller.balancer.on_start("b")
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        assert [c.replica for c in transport.calls] == ["a"]
        await timer.advance(0.1)
        assert len(transport.calls) == 1 and caller.stats.hedges_not_worth == 1
        for _ in range(60):  # b drains
            caller.balancer.on_finish("b", 0.002, ok=True)
        await timer.advance(0.1)
        assert [c.replica for c in transport.calls] == ["a", "b"]
        transport.answer(0)
        assert (await task).replica == "a"

    run(scenario)


def test_retries_after_failures_spend_their_own_budget():
    """Burst 1, ratio 0: the first failing call is retried, the next one is not (its error is
    raised at once) — a failing shard cannot double the traffic."""

    async def scenario():
        caller, transport, timer, shard = make_caller(retry_budget_ratio=0.001, retry_budget_burst=1.0)
        first = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(0, ShardUnavailable("refused", shard=0))
        await settle()
        transport.answer(1)
        assert (await first).attempts == 2 and caller.stats.retries == 1
        second = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(2, ShardUnavailable("refused again", shard=0))
        with pytest.raises(ShardUnavailable, match="refused again"):
            await second
        assert len(transport.calls) == 3 and caller.stats.retries_refused == 1

    run(scenario)


def test_a_replica_without_the_version_is_skipped_without_spending_retry_budget():
    async def scenario():
        caller, transport, timer, shard = make_caller(retry_budget_ratio=0.001, retry_budget_burst=0.0)
        task = asyncio.ensure_future(caller.call(0, shard, VECTORS, PARAMS, deadline=1.0))
        await settle()
        transport.fail(0, VersionConflict("not held", shard=0))
        await settle()
        transport.answer(1)
        assert (await task).replica == "r1" and caller.stats.retries_refused == 0

    run(scenario)
