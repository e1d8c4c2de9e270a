"""On-disk embedding cache keyed by (embedding version, sha256 of the text).

One SQLite file per embedding version under the cache root, so a new model can never be
served an old model's vector. SQLite's transactions make every write crash-safe; vectors are
stored as little-endian float32 blobs. :class:`CachingEncoder` wraps any encoder with it and
encodes only what is missing, in chunks, committing each chunk (an interrupted build keeps its work).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from retrieval import env
from retrieval.encoders import Encoder
from retrieval.types import EmbeddingVersion

logger = logging.getLogger(__name__)

_LOOKUP_CHUNK = 500  # keys per "IN (...)" lookup, under SQLite's variable limit


def default_cache_dir() -> Path:
    """$SHARDRAG_CACHE_DIR, else ~/.cache/shardrag/embeddings (XDG_CACHE_HOME honoured).
    For the command-line tools; library code takes the directory as an argument."""
    configured = env.read("SHARDRAG_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shardrag" / "embeddings"


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class EmbeddingCache:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @contextmanager
    def _connect(self, version: EmbeddingVersion) -> Iterator[sqlite3.Connection]:
        """A connection inside one transaction (committed on success, rolled back on error)."""
        self.root.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.root / f"{version.id}.sqlite", timeout=30)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB NOT NULL)")
            with connection:
                yield connection
        finally:
            connection.close()

    def get_many(self, version: EmbeddingVersion, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        """Vectors for ``texts`` (zeros where missing) and the indexes of the missing ones."""
        vectors = np.zeros((len(texts), version.dim), dtype=np.float32)
        keys = [text_key(t) for t in texts]
        found: dict[bytes, bytes] = {}
        with self._connect(version) as connection:
            for start in range(0, len(keys), _LOOKUP_CHUNK):
                chunk = list(set(keys[start : start + _LOOKUP_CHUNK]))
                marks = ",".join("?" * len(chunk))
                found.update(connection.execute(f"SELECT key, vector FROM vectors WHERE key IN ({marks})", chunk))
        missing = []
        row_bytes = version.dim * 4
        for index, key in enumerate(keys):
            blob = found.get(key)
            if blob is None or len(blob) != row_bytes:
                missing.append(index)
            else:
                vectors[index] = np.frombuffer(blob, dtype="<f4")
        return vectors, missing

    def put_many(self, version: EmbeddingVersion, texts: Sequence[str], vectors: np.ndarray) -> None:
        rows = [(text_key(t), np.asarray(v, dtype="<f4").tobytes()) for t, v in zip(texts, vectors, strict=True)]
        with self._connect(version) as connection:
            connection.executemany("INSERT OR REPLACE INTO vectors (key, vector) VALUES (?, ?)", rows)


class CachingEncoder:
    """An :class:`Encoder` that looks texts up in an :class:`EmbeddingCache` first."""

    def __init__(self, encoder: Encoder, cache: EmbeddingCache, *, chunk_size: int = 512) -> None:
        self._encoder = encoder
        self._cache = cache
        self._chunk_size = chunk_size

    @property
    def version(self) -> EmbeddingVersion:
        return self._encoder.version

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        return self._encoder.encode_queries(texts, show_progress=show_progress)

    def encode_texts(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        from tqdm.auto import tqdm

        vectors, missing = self._cache.get_many(self.version, texts)
        if missing:
            logger.info("embedding cache: %d of %d texts to encode", len(missing), len(texts))
        with tqdm(total=len(texts), initial=len(texts) - len(missing), desc="encoding", unit="doc",
                  disable=not show_progress) as progress:
            for start in range(0, len(missing), self._chunk_size):
                indexes = missing[start : start + self._chunk_size]
                chunk_texts = [texts[i] for i in indexes]
                encoded = self._encoder.encode_texts(chunk_texts)
                self._cache.put_many(self.version, chunk_texts, encoded)
                vectors[indexes] = encoded
                progress.update(len(indexes))
        return vectors
