"""Two ways to run a version's encoder behind one interface: in the gateway's encoder worker
processes (:class:`PoolBackend`, the default) or on a thread of the gateway process
(:class:`ThreadBackend`: no extra process; embedded gateways and tests with a custom model)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from retrieval.encoders import Encoder
from retrieval.errors import DeadlineExceeded
from retrieval.types import EmbeddingVersion
from serving.encoding.pool import EncoderPool


class EncoderBackend(Protocol):
    @property
    def parallelism(self) -> int:
        """Batches it can run at once."""
        ...

    async def load(self) -> EmbeddingVersion: ...

    async def encode(self, kind: str, texts: Sequence[str], deadline: float) -> np.ndarray:
        """``kind``: "query" or "document"; ``deadline``: a ``time.monotonic()`` instant."""
        ...

    def close(self) -> None: ...


class PoolBackend:
    """One holder of ``key`` in the shared pool: every gateway collection served by the same
    embedding version (the launched one, created text collections) has its own, and the model
    leaves the workers when the last of them closes."""

    def __init__(self, pool: EncoderPool, key: str, model: str) -> None:
        self._pool = pool
        self._key = key
        self._model = model
        self._closed = False
        pool.hold(key)

    @property
    def parallelism(self) -> int:
        return self._pool.parallelism

    async def load(self) -> EmbeddingVersion:
        return await self._pool.load(self._key, self._model)

    async def encode(self, kind: str, texts: Sequence[str], deadline: float) -> np.ndarray:
        return await self._pool.encode(self._key, kind, texts, deadline)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.release(self._key)


class ThreadBackend:
    """The encoder in this process, on one worker thread (torch releases the GIL in its kernels,
    but tokenising and loading a model hold it: the event loop shares the interpreter)."""

    def __init__(self, loader: Callable[[], Encoder]) -> None:
        self._loader = loader
        self._encoder: Encoder | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder")

    @property
    def parallelism(self) -> int:
        return 1

    async def load(self) -> EmbeddingVersion:
        self._encoder = await asyncio.get_running_loop().run_in_executor(self._executor, self._loader)
        return self._encoder.version

    async def encode(self, kind: str, texts: Sequence[str], deadline: float) -> np.ndarray:
        encoder = self._encoder
        assert encoder is not None, "encode before load"
        run = encoder.encode_queries if kind == "query" else encoder.encode_texts
        future = asyncio.get_running_loop().run_in_executor(self._executor, run, list(texts))
        try:
            return await asyncio.wait_for(future, max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            raise DeadlineExceeded("encoding did not finish before the deadline", field="text") from None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
