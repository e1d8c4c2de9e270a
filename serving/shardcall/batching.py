"""Natural batching: coalesce concurrent submissions without adding latency when idle.

A submission goes out at once while fewer than ``max_inflight`` batches are in flight; while
the limit is reached, submissions queue, and when a batch returns the queue leaves as one
batch (items with the same key only, up to ``max_batch``). At concurrency 1 every item is sent
alone; under load, per-request costs (HTTP, Python) are paid once per batch.

``max_wait_s`` > 0 adds a short wait, and only while another batch is in flight: a partial
batch then leaves when it is full or when its oldest item has waited that long, so a free worker
takes a fuller batch (dynamic batching). An idle batcher still sends at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")

_UNSET: Any = object()  # "no key chosen yet": None is a valid batch key


class NaturalBatcher(Generic[K, T, R]):
    def __init__(
        self,
        process: Callable[[K, list[T]], Awaitable[Sequence[R]]],
        *,
        max_batch: int = 64,
        max_inflight: int = 2,
        max_wait_s: float = 0.0,
    ) -> None:
        if max_batch < 1 or max_inflight < 1:
            raise ValueError("max_batch and max_inflight must be ≥ 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_s must be ≥ 0")
        self._process = process
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._max_wait_s = max_wait_s
        self._inflight = 0
        self._queue: deque[tuple[K, T, asyncio.Future[R]]] = deque()
        self._oldest_at = 0.0  # loop time the queue's oldest item arrived (max_wait_s only)
        self._timer: asyncio.TimerHandle | None = None

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, key: K, item: T) -> asyncio.Future[R]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        if self._max_wait_s and not self._queue:
            self._oldest_at = loop.time()
        self._queue.append((key, item, future))
        self._drain()
        return future

    def _must_wait(self) -> bool:
        """A partial batch waits (max_wait_s) while another batch is in flight."""
        if not self._inflight or len(self._queue) >= self._max_batch:
            return False
        loop = asyncio.get_running_loop()
        remaining = self._oldest_at + self._max_wait_s - loop.time()
        if remaining <= 0:
            return False
        if self._timer is None:
            self._timer = loop.call_later(remaining, self._on_timer)
        return True

    def _on_timer(self) -> None:
        self._timer = None
        self._drain()

    def _drain(self) -> None:
        while self._queue and self._inflight < self._max_inflight:
            if self._max_wait_s and self._must_wait():
                return
            batch = self._take_batch()
            if self._max_wait_s and self._queue:
                self._oldest_at = asyncio.get_running_loop().time()  # the rest waits from now
            if batch:
                self._inflight += 1
                asyncio.ensure_future(self._run(batch))

    def _take_batch(self) -> list[tuple[K, T, asyncio.Future[R]]]:
        """Up to ``max_batch`` live items sharing the key of the oldest live item."""
        batch: list[tuple[K, T, asyncio.Future[R]]] = []
        skipped: list[tuple[K, T, asyncio.Future[R]]] = []
        key = _UNSET
        while self._queue and len(batch) < self._max_batch:
            entry = self._queue.popleft()
            if entry[2].done():  # the caller gave up (deadline, cancel): do not send it
                continue
            if key is _UNSET:
                key = entry[0]
            if entry[0] == key:
                batch.append(entry)
            else:
                skipped.append(entry)
        self._queue.extendleft(reversed(skipped))
        return batch

    async def _run(self, batch: list[tuple[K, T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._process(batch[0][0], [item for _, item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batch of {len(batch)} got {len(results)} results")
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn of the failure
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
                    # A waiter that already gave up (a hedge that lost, a deadline) never reads
                    # it; reading it here keeps asyncio from logging "never retrieved" at GC.
                    future.add_done_callback(_retrieve_exception)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        else:
            for (_, _, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self._inflight -= 1
            self._drain()


def _retrieve_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
