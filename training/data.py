"""Slice-aware training data: rank r reads shard r of a built collection — its manifest and doc
store — never the whole corpus.

Pairs (query text, passage text):
* **given pairs** (a BEIR queries file + train qrels): every pair whose positive document lives
  in this rank's slice, i.e. routed to the rank that owns the positive's shard;
* otherwise **self-supervised pairs** from the slice itself: title → text for titled documents,
  and two independent random crops of the same text (Contriever) for the rest.

Batches are a pure function of (seed, rank, step): each epoch is a seeded permutation of the
slice's pairs (crops are re-drawn per epoch), so the sampler's position is just the step, and a
resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from index_shards.docstore import DocStore, StoredDoc
from index_shards.layout import DOCSTORE_FILE, resolve_version, shard_dir
from index_shards.manifest import verify_shard_dir
from retrieval.datasets import load_qrels, load_queries
from retrieval.errors import ConfigError


@dataclass(slots=True, frozen=True)
class Pair:
    query: str
    passage: str
    doc_id: str


class SliceData:
    """The training pairs of one rank's slice."""

    def __init__(self, root: str | Path, collection: str, rank: int, world_size: int, *, version: str | None = None,
                 seed: int = 0, crop: tuple[float, float] = (0.1, 0.5), train_queries: str | None = None,
                 train_qrels: str | None = None) -> None:
        directory, manifest = resolve_version(root, collection, version)
        if manifest.num_shards != world_size:
            raise ConfigError(f"{collection} has {manifest.num_shards} slices; train with one rank per slice "
                              f"(--nproc {manifest.num_shards}), not {world_size}", field="nproc")
        self.rank = rank
        self.seed = seed
        self.crop = crop
        self.version = manifest.embedding_version
        self.shard_directory = shard_dir(directory, rank)
        verify_shard_dir(self.shard_directory)
        store = DocStore(self.shard_directory / DOCSTORE_FILE)
        try:
            self.documents: list[StoredDoc] = [doc for _, doc in store.iter_all()]
        finally:
            store.close()
        self.doc_ids = {doc.doc_id for doc in self.documents}
        self.given: list[Pair] | None = None
        if train_queries and train_qrels:
            self.given = self._route_given(train_queries, train_qrels)
            if not self.given:
                raise ConfigError(f"slice {rank} holds no positive of the given training pairs", field="train_qrels")
        if not self.documents:
            raise ConfigError(f"slice {rank} of {collection} is empty", field="collection")

    def _route_given(self, queries_path: str, qrels_path: str) -> list[Pair]:
        """The given pairs whose positive is in this slice (the others belong to other ranks)."""
        queries = load_queries(queries_path)
        by_id = {doc.doc_id: doc for doc in self.documents}
        pairs = []
        for query_id, judged in sorted(load_qrels(qrels_path).items()):
            if query_id not in queries:
                continue
            for doc_id, grade in sorted(judged.items()):
                if grade > 0 and doc_id in by_id:
                    doc = by_id[doc_id]
                    pairs.append(Pair(queries[query_id], f"{doc.title} {doc.text}" if doc.title else doc.text, doc_id))
        return pairs

    def use_pairs(self, pairs: list[Pair]) -> None:
        """Train on these pairs of the slice (e.g. synthetic queries) instead of self-supervised ones."""
        if not pairs:
            raise ConfigError(f"slice {self.rank}: no training pairs left", field="synthetic_queries")
        self.given = list(pairs)

    # -- self-supervised pairs ---------------------------------------------------------------
    def _crop(self, words: list[str], rng: random.Random) -> str:
        if len(words) <= 3:
            return " ".join(words)
        length = max(1, round(len(words) * rng.uniform(*self.crop)))
        start = rng.randrange(0, len(words) - length + 1)
        return " ".join(words[start:start + length])

    def _epoch_pairs(self, epoch: int) -> list[Pair]:
        rng = random.Random(f"{self.seed}/{self.rank}/{epoch}")
        if self.given is not None:
            pairs = list(self.given)
        else:
            pairs = []
            for doc in self.documents:
                if doc.title:
                    pairs.append(Pair(doc.title, doc.text, doc.doc_id))
                else:
                    words = doc.text.split()
                    pairs.append(Pair(self._crop(words, rng), self._crop(words, rng), doc.doc_id))
        rng.shuffle(pairs)
        return pairs

    def random_passages(self, key: str, count: int) -> list[str]:
        """``count`` passages of the slice drawn with a seed derived from ``key`` (deterministic)."""
        rng = random.Random(f"{self.seed}/{self.rank}/passages/{key}")
        docs = [self.documents[rng.randrange(len(self.documents))] for _ in range(count)]
        return [f"{doc.title} {doc.text}" if doc.title else doc.text for doc in docs]

    def __len__(self) -> int:
        return len(self.given) if self.given is not None else len(self.documents)

    def batch(self, step: int, batch_size: int) -> list[Pair]:
        """The ``step``-th batch of this rank (epochs wrap around, reshuffled)."""
        n = len(self)
        start = step * batch_size
        out: list[Pair] = []
        cached: dict[int, list[Pair]] = {}
        while len(out) < batch_size:
            epoch, offset = divmod(start + len(out), n)
            if epoch not in cached:
                cached[epoch] = self._epoch_pairs(epoch)
            take = min(batch_size - len(out), n - offset)
            out.extend(cached[epoch][offset:offset + take])
        return out
