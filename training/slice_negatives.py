"""Hard negatives from the ranks' own slices, re-encoded as the encoder trains (ANCE-style).

Negatives mined from the serving index were embedded by the *old* model; as the encoder moves
they go stale. Here every ``refresh_every`` steps each rank re-encodes **its own slice** with the
current weights (1/world of the corpus per rank, all ranks at once) into a local exact FAISS
index. For every step's negatives:

1. each rank encodes its batch's queries (no gradient) and the query vectors and positives of
   the whole global batch are all-gathered;
2. each rank searches its own slice index for *every* global query (top ``depth`` + the global
   batch size, so positives can be skipped) and the candidates — score, doc id, passage — are
   all-gathered;
3. each rank merges, for its own queries, the candidates of all slices by score and takes the
   best-ranked one that is not a positive of the global batch (the query's own positive is the
   target; another pair's positive is already an in-batch negative).

Every rank takes part in every collective at the same steps, so the ranks stay in lockstep. A
run resumed from a checkpoint re-encodes at the resume step (the weights of the last refresh are
not kept), so its negatives after a restart can differ slightly from an uninterrupted run's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from training.data import Pair
from training.model import BiEncoder, encode_texts

logger = logging.getLogger(__name__)


def _passage(doc: Any) -> str:
    return f"{doc.title} {doc.text}" if doc.title else str(doc.text)


def _gather(value: Any, world: int) -> list[Any]:
    if world == 1:
        return [value]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, value)
    return out


class SliceNegatives:
    """One per rank; the interface of :class:`training.hard_negatives.HardNegativeMiner`."""

    def __init__(self, documents: Sequence[Any], model: BiEncoder, device: torch.device, *, refresh_every: int,
                 depth: int = 5, encode_batch: int = 64, rank: int = 0, world: int = 1,
                 record: bool = False) -> None:
        self.documents = list(documents)
        self.passages = [_passage(doc) for doc in self.documents]
        self.model = model
        self.device = device
        self.refresh_every = refresh_every
        self.depth = depth
        self.encode_batch = encode_batch
        self.rank = rank
        self.world = world
        self.record = record  # keep what was encoded and mined (tests)
        self.index: Any = None
        self.refreshed_at = -1
        self.refreshes: list[dict[str, Any]] = []  # step, seconds (+ encoded doc ids when recording)
        self.mined = 0
        self.failures = 0  # pairs left without a negative (every candidate was a positive)
        self.pairs: list[tuple[str, str]] = []  # (positive doc id, negative doc id) when recording

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        return encode_texts(self.model, texts, self.device, batch_size=self.encode_batch)

    def refresh(self, step: int) -> None:
        """Re-encode this rank's slice with the current weights into a fresh exact index."""
        import time

        import faiss

        started = time.perf_counter()
        vectors = self._encode(self.passages)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        self.index = index
        self.refreshed_at = step
        entry: dict[str, Any] = {"step": step, "seconds": round(time.perf_counter() - started, 3),
                                 "passages": len(self.passages)}
        if self.record:
            entry["doc_ids"] = [doc.doc_id for doc in self.documents]
        self.refreshes.append(entry)
        logger.info("rank %d re-encoded its slice (%d passages) at step %d in %.1f s", self.rank,
                    len(self.passages), step, entry["seconds"])

    def negatives(self, step: int, batch: Sequence[Pair]) -> list[str | None]:
        if self.index is None or step - self.refreshed_at >= self.refresh_every:
            self.refresh(step)
        queries = self._encode([pair.query for pair in batch])
        all_queries = np.concatenate(_gather(queries, self.world))
        per_rank_ids = _gather([pair.doc_id for pair in batch], self.world)
        positives = [doc_id for ids in per_rank_ids for doc_id in ids]
        want = min(self.index.ntotal, self.depth + len(positives))
        scores, rows = self.index.search(all_queries, want)
        local = [[(float(s), self.documents[r].doc_id, self.passages[r]) for s, r in zip(scores[q], rows[q]) if r >= 0]
                 for q in range(len(all_queries))]
        merged_by_rank = _gather(local, self.world)
        excluded = set(positives)
        offset = sum(len(ids) for ids in per_rank_ids[: self.rank])  # this rank's queries in the global order
        out: list[str | None] = []
        for j, pair in enumerate(batch):
            candidates = sorted((c for per_rank in merged_by_rank for c in per_rank[offset + j]),
                                key=lambda c: (-c[0], c[1]))
            choice = next(((doc_id, passage) for _, doc_id, passage in candidates if doc_id not in excluded), None)
            if choice is None:
                self.failures += 1
                out.append(None)
                continue
            self.mined += 1
            if self.record:
                self.pairs.append((pair.doc_id, choice[0]))
            out.append(choice[1])
        return out

    def close(self) -> None:
        self.index = None
