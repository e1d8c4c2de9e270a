"""Choosing a search knob from measured answers — the pure half of ``shardrag tune`` and of
``POST /v1/collections/{name}/tune``: each shard's answers to the tuning queries at every
candidate value (:class:`ShardTuning`, measured next to the index by ``index_shards.tuning``),
merged as the gateway merges a fan-out, and the cheapest value whose recall meets the target
with 95 % confidence (:func:`choose`). Also the one binary form of a :class:`ShardTuning` and of
a set of tuning queries between a replica and the gateway (numpy ``.npz``, no pickles).
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from retrieval.errors import ConfigError, MalformedBody

NO_ID = -1
Z_95 = 1.645  # one-sided 95 % normal quantile for the recall lower bound


@dataclass(slots=True)
class ShardTuning:
    shard_id: int
    factory: str
    count: int
    knob: str | None
    values: list[int]
    exact_scores: np.ndarray  # n × k, higher is better
    exact_ids: np.ndarray
    scores: list[np.ndarray] = field(default_factory=list)  # per value, n × k
    ids: list[np.ndarray] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # per value: the n queries one at a time
    build_s: float = 0.0  # the rebuild's seconds (0: the published index as it is)
    index_bytes: int = 0  # the index serialized (what a replica maps or loads)


def is_lossy(factory: str) -> bool:
    """True when the index stores compressed codes (PQ, SQ, LSH...), so decoded vectors are not the originals."""
    tail = factory.replace(" ", "").split(",")[-1].upper()
    if tail.startswith("REFINE(") and tail.endswith(")"):  # a refine stage's vectors are what is decoded
        tail = tail[len("REFINE("):-1]
    return not (tail.endswith("FLAT") or tail == "" or (tail.startswith("HNSW") and "_" not in tail))


def merge_top_k(scores: Sequence[np.ndarray], ids: Sequence[np.ndarray], k: int) -> np.ndarray:
    """The gateway's merge: the best ``k`` ids per row over every shard's top k."""
    all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    order = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(all_ids, order, axis=1)


def per_query_recall(found: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|found ∩ exact| / |exact| per row (ids of -1 are padding)."""
    out = np.empty(len(found))
    for row in range(len(found)):
        truth = set(exact[row][exact[row] != NO_ID].tolist())
        out[row] = len(truth.intersection(found[row].tolist())) / len(truth) if truth else 1.0
    return out


def lower_bound(recalls: np.ndarray) -> float:
    """One-sided 95 % lower confidence bound of the mean recall."""
    if len(recalls) < 2:
        return float(recalls.mean()) if len(recalls) else 0.0
    return float(recalls.mean() - Z_95 * recalls.std(ddof=1) / math.sqrt(len(recalls)))


@dataclass(frozen=True, slots=True)
class Candidate:
    value: int
    recall: float  # mean recall@k on the tuning queries
    recall_low: float  # its 95 % lower bound
    holdout_recall: float | None  # on the held-out queries
    qps: float  # queries/s one at a time, the slowest shard's (a fan-out waits for it)
    pareto: bool  # no other value has both higher recall and higher QPS


@dataclass(frozen=True, slots=True)
class TuneReport:
    knob: str | None
    factory: str
    target: float
    k: int
    tune_queries: int
    holdout_queries: int
    lossy: bool
    candidates: tuple[Candidate, ...]
    chosen: Candidate | None  # None: no value reaches the target (or nothing to tune)

    def to_dict(self) -> dict[str, object]:
        return {"knob": self.knob, "factory": self.factory, "target": self.target, "k": self.k,
                "tune_queries": self.tune_queries, "holdout_queries": self.holdout_queries, "lossy": self.lossy,
                "candidates": [asdict(c) for c in self.candidates],
                "chosen": asdict(self.chosen) if self.chosen else None}


def split_holdout(n: int, holdout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(tuning rows, held-out rows) of ``n`` queries."""
    order = np.random.default_rng(seed).permutation(n)
    held = int(round(n * holdout_fraction))
    return np.sort(order[held:]), np.sort(order[:held])


def choose(results: Sequence[ShardTuning], target: float, k: int, tune_rows: np.ndarray,
           holdout_rows: np.ndarray, truth: np.ndarray | None = None) -> TuneReport:
    """Merge the shards' answers per candidate and pick the cheapest value that meets ``target``.
    ``truth``: the exact top-k int ids per query over the whole collection, when the caller has
    the original vectors (default: merged from the shards' exact answers)."""
    if not 0.0 < target <= 1.0:
        raise ConfigError(f"the recall target must be in (0, 1], not {target}", field="recall")
    first = results[0]
    knobs = {r.knob for r in results}
    if len(knobs) != 1 or len({tuple(r.values) for r in results}) != 1:
        raise ConfigError(f"the shards of this version disagree on their index type ({sorted(map(str, knobs))})",
                          field="collection")
    exact = truth if truth is not None else \
        merge_top_k([r.exact_scores for r in results], [r.exact_ids for r in results], k)
    candidates = []
    for i, value in enumerate(first.values):
        found = merge_top_k([r.scores[i] for r in results], [r.ids[i] for r in results], k)
        recalls = per_query_recall(found, exact)
        slowest = max(r.seconds[i] for r in results)
        tune_part = recalls[tune_rows]
        candidates.append(Candidate(value, float(tune_part.mean()), lower_bound(tune_part),
                                    float(recalls[holdout_rows].mean()) if len(holdout_rows) else None,
                                    len(recalls) / slowest if slowest > 0 else float("inf"), False))
    marked = tuple(Candidate(c.value, c.recall, c.recall_low, c.holdout_recall, c.qps,
                             not any(o.recall >= c.recall and o.qps >= c.qps and (o.recall > c.recall or o.qps > c.qps)
                                     for o in candidates)) for c in candidates)
    meeting = [c for c in marked if c.recall_low >= target]
    return TuneReport(first.knob, first.factory, target, k, len(tune_rows), len(holdout_rows),
                      is_lossy(first.factory) and truth is None,
                      marked, min(meeting, key=lambda c: c.value) if meeting else None)


def encode_result(result: ShardTuning) -> bytes:
    """A :class:`ShardTuning` as the bytes a replica answers ``POST /admin/tune/evaluate`` with."""
    arrays: dict[str, np.ndarray] = {
        "exact_scores": result.exact_scores, "exact_ids": result.exact_ids,
        "values": np.asarray(result.values, dtype=np.int64), "seconds": np.asarray(result.seconds, dtype=np.float64),
        "head": np.asarray([result.shard_id, result.count, result.index_bytes], dtype=np.int64),
        "build_s": np.asarray([result.build_s], dtype=np.float64),
        "names": np.asarray([result.factory, result.knob or ""])}
    for i, (scores, ids) in enumerate(zip(result.scores, result.ids, strict=True)):
        arrays[f"scores_{i}"], arrays[f"ids_{i}"] = scores, ids
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]  # numpy's stub types the keywords as allow_pickle
    return out.getvalue()


def decode_result(data: bytes) -> ShardTuning:
    """:func:`encode_result`'s bytes back (MalformedBody when they do not parse)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as found:
            values = [int(v) for v in found["values"]]
            shard_id, count, index_bytes = (int(v) for v in found["head"])
            factory, knob = (str(v) for v in found["names"])
            return ShardTuning(shard_id, factory, count, knob or None, values, found["exact_scores"],
                               found["exact_ids"], [found[f"scores_{i}"] for i in range(len(values))],
                               [found[f"ids_{i}"] for i in range(len(values))],
                               [float(v) for v in found["seconds"]], float(found["build_s"][0]), index_bytes)
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise MalformedBody(f"a tuning result that does not parse: {exc}", field="body") from exc


def encode_queries(queries: np.ndarray, ids: np.ndarray) -> bytes:
    """Tuning queries (n × dim float32) with the id each one leaves out of its answers (-1: none)."""
    out = io.BytesIO()
    np.savez(out, queries=np.asarray(queries, dtype=np.float32), ids=np.asarray(ids, dtype=np.int64))
    return out.getvalue()


def decode_queries(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as found:
            queries, ids = found["queries"], found["ids"]
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise MalformedBody(f"tuning queries that do not parse: {exc}", field="body") from exc
    if queries.ndim != 2 or ids.shape != (len(queries),) or not np.isfinite(queries).all():
        raise MalformedBody("tuning queries must be n × dim finite float32 with n ids", field="body")
    return np.ascontiguousarray(queries, dtype=np.float32), ids.astype(np.int64)
