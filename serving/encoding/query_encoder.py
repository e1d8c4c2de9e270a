"""A version's query encoder as its queries see it: the (version, text) cache, then queries
already being encoded (a concurrent duplicate waits for the same vector), then the batcher,
which hands the backend one batch per free worker. Loaded in the background at startup and
checked against the collection's embedding version."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from retrieval.encoders import format_document
from retrieval.errors import DeadlineExceeded, EncoderError, VersionConflict
from retrieval.types import Document, EmbeddingVersion
from serving.encoding.backends import EncoderBackend
from serving.encoding.cache import EmbeddingLRU
from serving.encoding.settings import EncoderSettings
from serving.shardcall.batching import NaturalBatcher

logger = logging.getLogger(__name__)

DOCUMENT_DEADLINE_S = 600.0  # a write's text is embedded however long the batch takes


class QueryEncoder:
    """States: disabled → (loading → ready | failed | mismatch)."""

    def __init__(self, backend: EncoderBackend | None, expected_version_id: str, *,
                 settings: EncoderSettings | None = None, cache: EmbeddingLRU | None = None) -> None:
        settings = settings or EncoderSettings()
        self._backend = backend
        self._expected = expected_version_id
        self._cache = cache
        self._pending: dict[str, asyncio.Future[np.ndarray]] = {}
        self._batcher: NaturalBatcher[None, tuple[str, float], np.ndarray] = NaturalBatcher(
            self._encode_batch, max_batch=settings.max_batch,
            max_inflight=backend.parallelism if backend is not None else 1,
            max_wait_s=settings.max_wait_ms / 1000.0)
        self.state = "disabled" if backend is None else "loading"
        self.error: str | None = None
        self.version: EmbeddingVersion | None = None
        self._loaded: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._backend is not None:
            self._loaded = asyncio.ensure_future(self._load(self._backend))

    async def _load(self, backend: EncoderBackend) -> None:
        started = time.perf_counter()
        try:
            version = await backend.load()
        except Exception as exc:  # noqa: BLE001 - reported through state and /healthz
            self.state, self.error = "failed", getattr(exc, "message", None) or str(exc)
            logger.error("query encoder for %s failed to load: %s", self._expected, self.error)
            return
        if version.id != self._expected:
            self.state = "mismatch"
            self.error = f"encoder is {version.id}, the collection is {self._expected}"
            logger.error("query encoder refused: %s", self.error)
            return
        self.version = version
        self.state = "ready"
        logger.info("query encoder for %s ready in %.2f s", self._expected, time.perf_counter() - started)

    async def wait_ready(self, timeout_s: float) -> None:
        if self._loaded is not None:
            await asyncio.wait_for(asyncio.shield(self._loaded), timeout_s)

    async def _ready(self, field: str) -> EncoderBackend:
        if self.state == "loading" and self._loaded is not None:
            await asyncio.shield(self._loaded)
        if self.state == "mismatch":
            raise VersionConflict(f"text refused: {self.error}", field=field)
        if self.state != "ready" or self._backend is None:
            raise EncoderError(f"query encoder of {self._expected} is {self.state}"
                               + (f": {self.error}" if self.error else "")
                               + ("; send a vector instead" if field == "text" else ""), field=field)
        return self._backend

    async def encode(self, text: str, timeout_s: float = 60.0) -> np.ndarray:
        cache = self._cache
        if cache is not None and (vector := cache.get(self._expected, text)) is not None:
            return vector
        await self._ready("text")
        pending = self._pending.get(text)
        if pending is None:
            pending = self._batcher.submit(None, (text, time.monotonic() + timeout_s))
            self._pending[text] = pending
            pending.add_done_callback(lambda done: self._finished(text, done))
        try:
            # shield: a caller that gives up must not cancel the vector a duplicate waits for
            return await asyncio.wait_for(asyncio.shield(pending), timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(f"encoding the text took longer than {timeout_s * 1000:.0f} ms",
                                   field="text") from None

    def cached(self, text: str) -> np.ndarray | None:
        """The text's vector when the cache already holds it (no encoding to wait for), else None."""
        return self._cache.peek(self._expected, text) if self._cache is not None else None

    def _finished(self, text: str, done: asyncio.Future[np.ndarray]) -> None:
        if self._pending.get(text) is done:
            del self._pending[text]
        if self._cache is not None and not done.cancelled() and done.exception() is None:
            self._cache.put(self._expected, text, done.result())

    async def encode_documents(self, documents: Sequence[Document]) -> np.ndarray:
        """Document vectors for written documents (title + text, the version's preprocessing),
        by the same workers, between query batches."""
        backend = await self._ready("documents")
        assert self.version is not None
        texts = [format_document(d, self.version.preprocessing) for d in documents]
        return await backend.encode("document", texts, time.monotonic() + DOCUMENT_DEADLINE_S)

    async def _encode_batch(self, _: None, items: list[tuple[str, float]]) -> Sequence[np.ndarray]:
        assert self._backend is not None
        deadline = max(deadline for _, deadline in items)
        vectors = await self._backend.encode("query", [text for text, _ in items], deadline)
        return list(vectors)

    def describe(self) -> dict[str, Any]:
        return {"state": self.state, **({"error": self.error} if self.error else {}),
                "queued": self._batcher.queued, "batches_in_flight": self._batcher.inflight}

    def close(self) -> None:
        if self._loaded is not None:
            self._loaded.cancel()
        if self._cache is not None:
            self._cache.drop_version(self._expected)
        if self._backend is not None:
            self._backend.close()
