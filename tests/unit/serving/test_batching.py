import asyncio

import pytest

from serving.shardcall.batching import NaturalBatcher


class Recorder:
    """A process function that holds each batch until released, recording what it got."""

    def __init__(self):
        self.batches: list[tuple[str, list[int]]] = []
        self.release = asyncio.Event()
        self.fail = False

    async def __call__(self, key, items):
        self.batches.append((key, list(items)))
        await self.release.wait()
        if self.fail:
            raise RuntimeError("shard down")
        return [item * 10 for item in items]


def run(coro):
    return asyncio.run(coro)


def test_idle_submission_goes_out_alone_and_at_once():
    async def scenario():
        recorder = Recorder()
        batcher = NaturalBatcher(recorder, max_batch=8, max_inflight=1)
        future = batcher.submit("k", 1)
        await asyncio.sleep(0)
        assert recorder.batches == [("k", [1])]
        recorder.release.set()
        assert await future == 10

    run(scenario())


def test_queued_submissions_leave_as_one_batch_per_key():
    async def scenario():
        recorder = Recorder()
        batcher = NaturalBatcher(recorder, max_batch=3, max_inflight=1)
        first = batcher.submit("a", 1)
        queued = [batcher.submit("a", 2), batcher.submit("b", 3), batcher.submit("a", 4), batcher.submit("a", 5),
                  batcher.submit("a", 6)]
        await asyncio.sleep(0)
        assert batcher.queued == 5 and batcher.inflight == 1
        recorder.release.set()
        results = await asyncio.gather(first, *queued)
        assert results == [10, 20, 30, 40, 50, 60]
        assert recorder.batches == [("a", [1]), ("a", [2, 4, 5]), ("b", [3]), ("a", [6])]

    run(scenario())


def test_failure_reaches_every_waiter_of_the_batch():
    async def scenario():
        recorder = Recorder()
        recorder.fail = True
        batcher = NaturalBatcher(recorder, max_batch=8, max_inflight=1)
        futures = [batcher.submit("k", i) for i in range(3)]
        recorder.release.set()
        for future in futures:
            with pytest.raises(RuntimeError, match="shard down"):
                await future
        assert batcher.inflight == 0

    run(scenario())


def test_cancelled_waiters_are_not_sent():
    async def scenario():
        recorder = Recorder()
        batcher = NaturalBatcher(recorder, max_batch=8, max_inflight=1)
        batcher.submit("k", 1)
        gone = batcher.submit("k", 2)
        kept = batcher.submit("k", 3)
        gone.cancel()
        recorder.release.set()
        assert await kept == 30
        assert recorder.batches == [("k", [1]), ("k", [3])]

    run(scenario())


def test_limits_validated():
    with pytest.raises(ValueError):
        NaturalBatcher(Recorder(), max_batch=0)


def test_none_is_a_key_like_any_other():
    """A batch never mixes keys, also when the first key is None (it once meant "no key yet")."""
    async def scenario():
        recorder = Recorder()
        batcher = NaturalBatcher(recorder, max_batch=8, max_inflight=1)
        first = batcher.submit("busy", 0)  # holds the only in-flight slot
        await asyncio.sleep(0)
        queued = [batcher.submit(None, 1), batcher.submit("x", 2), batcher.submit(None, 3)]
        recorder.release.set()
        await asyncio.gather(first, *queued)
        assert recorder.batches == [("busy", [0]), (None, [1, 3]), ("x", [2])]

    run(scenario())


def test_max_wait_fills_a_batch_while_another_is_in_flight():
    """With max_wait_s, a free slot takes a fuller batch: the queue waits for the batch to fill (or
    for max_wait) only while another batch is in flight; an idle batcher still sends at once."""

    async def scenario():
        recorder = Recorder()
        batcher = NaturalBatcher(recorder, max_batch=3, max_inflight=2, max_wait_s=0.05)
        first = batcher.submit("k", 1)
        await asyncio.sleep(0)
        assert recorder.batches == [("k", [1])]  # idle: at once, no wait
        second = batcher.submit("k", 2)
        await asyncio.sleep(0.01)
        assert len(recorder.batches) == 1  # a slot is free, but the batch waits to fill
        rest = [batcher.submit("k", i) for i in (3, 4)]
        await asyncio.sleep(0)
        assert recorder.batches[1] == ("k", [2, 3, 4])  # full: leaves at once
        fifth = batcher.submit("k", 5)
        recorder.release.set()
        assert [await f for f in (first, second, *rest, fifth)] == [10, 20, 30, 40, 50]
        assert recorder.batches[2] == ("k", [5])

    run(scenario())


def test_max_wait_expires_and_sends_a_partial_batch():
    async def scenario():
        loop = asyncio.get_running_loop()
        recorder = Recorder()
        batcher = NaturalBatcher(recorder, max_batch=8, max_inflight=2, max_wait_s=0.03)
        batcher.submit("k", 1)
        await asyncio.sleep(0)
        started = loop.time()
        waiting = batcher.submit("k", 2)
        while len(recorder.batches) < 2:
            await asyncio.sleep(0.002)
        assert 0.025 <= loop.time() - started < 0.5 and recorder.batches[1] == ("k", [2])
        recorder.release.set()
        assert await waiting == 20

    run(scenario())
