"""The gateway's encoder service: makes each loaded version's :class:`QueryEncoder` on the
configured backend, and owns what they share — the worker processes and the embedding cache."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from retrieval.encoders import Encoder
from retrieval.errors import ConfigError
from retrieval.types import EmbeddingVersion
from serving.encoding.backends import EncoderBackend, PoolBackend, ThreadBackend
from serving.encoding.cache import EmbeddingLRU
from serving.encoding.pool import EncoderPool
from serving.encoding.query_encoder import QueryEncoder
from serving.encoding.settings import EncoderSettings

logger = logging.getLogger(__name__)

EncoderLoader = Callable[[str], Encoder]  # model ("default" or a checkpoint dir) → encoder, in this process


def local_loader(settings: EncoderSettings) -> EncoderLoader:
    """Models loaded in this process (the thread backend) with the settings' device and threads."""

    def load(model: str) -> Encoder:
        from retrieval.encoders import load_encoder

        # runs on the encoder's own worker thread, which then does every encode: set its pool there
        return load_encoder(None if model == "default" else model, device=settings.device, threads=settings.threads,
                            runtime=settings.runtime)

    return load


class EncoderService:
    """``loader`` is used by the thread backend (default: :func:`local_loader`); the process
    backend loads models in its worker processes by name."""

    def __init__(self, settings: EncoderSettings, *, loader: EncoderLoader | None = None) -> None:
        settings.validate()
        if settings.backend == "process" and loader is not None:
            raise ConfigError("a custom encoder loader runs in this process: use encoder.backend 'thread'",
                              field="encoder.backend")
        self.settings = settings
        self.cache = EmbeddingLRU(settings.cache_size)
        self._loader = loader or local_loader(settings)
        self._pool = EncoderPool(settings) if settings.backend == "process" else None

    def start(self) -> None:
        if self._pool is not None:
            self._pool.start()

    def make(self, version: str, model: str) -> QueryEncoder:
        """The encoder of ``version`` (from ``model``), loading in the background."""
        backend: EncoderBackend
        if self._pool is not None:
            backend = PoolBackend(self._pool, version, model)
        else:
            loader = self._loader
            backend = ThreadBackend(lambda: loader(model))
        encoder = QueryEncoder(backend, version, settings=self.settings, cache=self.cache)
        encoder.start()
        return encoder

    async def probe(self, model: str) -> EmbeddingVersion:
        """The embedding version ``model`` produces (loaded once on the configured backend, then
        let go): what a created collection's rollout names its new version by."""
        backend: EncoderBackend
        if self._pool is not None:
            backend = PoolBackend(self._pool, f"probe:{model}", model)
        else:
            loader = self._loader
            backend = ThreadBackend(lambda: loader(model))
        try:
            return await backend.load()
        finally:
            backend.close()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.settings.backend, "runtime": self.settings.runtime, "cache": self.cache.stats(),
                **({"workers": self._pool.describe()} if self._pool is not None else {})}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
