"""Test doubles for the gateway's seams: a virtual clock and a transport whose answers the test
hands out by hand. Nothing sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retrieval.bm25 import LexicalQuery
from retrieval.contract import HealthInfo, ReplicaInfo, SearchParams, StageReply, UnloadReply
from serving.transport.client import ShardClient, ShardReply


class FakeTimer:
    """Virtual time for ShardCaller: ``advance`` moves it and wakes what was waiting."""

    def __init__(self) -> None:
        self.t = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def wait_first(self, tasks: set[asyncio.Future], timeout_s: float) -> set[asyncio.Future]:
        done = {task for task in tasks if task.done()}
        if done or timeout_s <= 0:
            return done
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.t + timeout_s, wake)
        self._sleepers.append(entry)

        def on_done(_: Any) -> None:
            if not wake.done():
                wake.set_result(None)

        for task in tasks:
            task.add_done_callback(on_done)
        try:
            await wake
        finally:
            self._sleepers.remove(entry)
            for task in tasks:
                task.remove_done_callback(on_done)
        return {task for task in tasks if task.done()}

    async def advance(self, seconds: float) -> None:
        self.t += seconds
        for when, wake in list(self._sleepers):
            if when <= self.t and not wake.done():
                wake.set_result(None)
        await settle()


class Clock:
    """A settable clock for the balancers and the outlier detector."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def settle(rounds: int = 10) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@dataclass
class PendingCall:
    replica: str
    future: asyncio.Future
    timeout_s: float
    cancelled: bool = False


@dataclass
class FakeShardClient(ShardClient):
    calls: list[PendingCall] = field(default_factory=list)

    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float, *, lexical: Sequence[LexicalQuery] = ()) -> ShardReply:
        call = PendingCall(replica, asyncio.get_running_loop().create_future(), timeout_s)
        self.calls.append(call)
        try:
            return await call.future
        except asyncio.CancelledError:
            call.cancelled = True
            raise

    async def info(self, replica: str, timeout_s: float) -> ReplicaInfo:
        return ReplicaInfo("fake", 0, 1, ())

    async def health(self, replica: str, timeout_s: float) -> HealthInfo:
        return HealthInfo(0, ())

    async def stage(self, replica: str, version: str, timeout_s: float) -> StageReply:
        raise NotImplementedError

    async def unload(self, replica: str, version: str, timeout_s: float) -> UnloadReply:
        raise NotImplementedError

    # the write path: the hedging tests never write
    async def primary_write(self, replica, shard_id, version, records, ack, generation, timeout_s):
        raise NotImplementedError

    async def writes_after(self, replica, version, after_seq, timeout_s):
        raise NotImplementedError

    async def snapshot(self, replica, version, timeout_s):
        raise NotImplementedError

    async def fence(self, replica, generation, hold_s, timeout_s):
        raise NotImplementedError

    async def document(self, replica, shard_id, version, doc_id, timeout_s):
        raise NotImplementedError

    async def matching_ids(self, replica, shard_id, version, filter_canonical, limit, timeout_s):
        raise NotImplementedError

    async def scan(self, replica, shard_id, version, filter_canonical, after, limit, timeout_s):
        raise NotImplementedError

    async def tune_sample(self, replica, version, count, seed, timeout_s):
        raise NotImplementedError

    async def tune_evaluate(self, replica, version, queries, k, max_value, timeout_s):
        raise NotImplementedError

    async def set_search_defaults(self, replica, version, defaults, timeout_s):
        raise NotImplementedError

    def answer(self, index: int, version: str = "v1") -> None:
        call = self.calls[index]
        call.future.set_result(ShardReply(0, version, call.replica,
                                          [{"doc_ids": ["d"], "scores": [1.0], "titles": [""], "texts": [""]}], 1.0))

    def fail(self, index: int, error: Exception) -> None:
        self.calls[index].future.set_exception(error)
