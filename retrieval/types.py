"""Records shared by every package: documents, hits, shard results, embedding versions."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NewType

from retrieval.errors import ConfigError

DocId = NewType("DocId", str)
"""A document's id as the user gave it (a string, kept as a string end to end)."""

IntId = NewType("IntId", int)
"""The stable int64 a document id maps to inside FAISS."""

ShardId = NewType("ShardId", int)


@dataclass(slots=True, frozen=True)
class Document:
    doc_id: DocId
    text: str
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class Hit:
    """One retrieved document. ``score``: higher is better (inner product, or -L2²)."""

    doc_id: DocId
    score: float
    shard_id: ShardId
    title: str = ""
    text: str = ""
    version: str = ""  # the embedding version the score was computed in
    metadata: Mapping[str, Any] | None = None  # when the query asked for it


@dataclass(slots=True, frozen=True)
class ShardResult:
    """One shard's answer to one query."""

    shard_id: ShardId
    version_id: str
    hits: tuple[Hit, ...]
    replica: str = ""
    latency_ms: float = 0.0


DOC_FORMAT_TITLE_SPACE_TEXT = "title_space_text"


@dataclass(slots=True, frozen=True)
class Preprocessing:
    """How text becomes a vector; part of the embedding version's identity."""

    normalize: bool = True  # L2-normalise vectors, so inner product = cosine
    max_tokens: int = 256  # encoder truncation
    doc_format: str = DOC_FORMAT_TITLE_SPACE_TEXT  # BEIR: "title text" when a title exists
    query_prefix: str = ""  # e.g. "query: " for E5-style models
    doc_prefix: str = ""

    def digest(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(slots=True, frozen=True)
class EmbeddingVersion:
    """The identity of a vector space: encoder name + sha256 of its weights + preprocessing.

    Two vectors are comparable only when their versions' ``id`` are equal.
    """

    encoder_name: str
    weights_sha256: str
    dim: int
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    _id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Safe in file names and URLs; long enough that a collision means the same weights.
        # Computed once: the id is read on every query.
        name = _SAFE.sub("-", self.encoder_name).strip("-") or "encoder"
        object.__setattr__(self, "_id", f"{name}.w{self.weights_sha256[:16]}.p{self.preprocessing.digest()[:8]}")

    @property
    def id(self) -> str:
        return self._id

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "encoder_name": self.encoder_name,
            "weights_sha256": self.weights_sha256,
            "dim": self.dim,
            "preprocessing": asdict(self.preprocessing),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EmbeddingVersion:
        version = cls(
            encoder_name=str(data["encoder_name"]),
            weights_sha256=str(data["weights_sha256"]),
            dim=int(data["dim"]),
            preprocessing=Preprocessing(**dict(data.get("preprocessing", {}))),
        )
        stated = data.get("id")
        if stated is not None and stated != version.id:
            raise ValueError(f"embedding version id {stated!r} does not match its fields ({version.id!r})")
        return version


# The build breadth of an HNSW graph (FAISS's efConstruction: candidates kept while linking each
# vector) that a build or a created collection accepts — below 4 a graph barely links, above 4,096
# a shard of a million vectors takes hours. None everywhere means FAISS's own 40.
EF_CONSTRUCTION_RANGE = (4, 4096)


def check_ef_construction(value: int | None, *, field: str = "ef_construction") -> int | None:
    """``value`` if it is None or within :data:`EF_CONSTRUCTION_RANGE`, else a ConfigError naming ``field``."""
    low, high = EF_CONSTRUCTION_RANGE
    if value is not None and not low <= value <= high:
        raise ConfigError(f"{field} must be between {low} and {high}, got {value}", field=field)
    return value
