"""A running replica's half of ``POST /v1/collections/{name}/tune`` (the REST twin of ``shardrag
tune``): the gateway draws pseudo-queries from every shard (:func:`sample`), has one replica
per shard answer all of them at every candidate value of the knob (:func:`evaluate`), chooses
(``retrieval.tuning_choice``) and gives every replica the chosen value (:func:`set_defaults`).

What is measured is the replica's current **base** index (the build, or its latest compaction):
documents still in the write segment are scored exactly whatever the knob says. The evaluation
runs on a clone of the index, so live queries never see a candidate's setting, one query at a time
on one FAISS thread (the figure a replica serves at c=1; the process's thread count is restored
after). A chosen value is kept in ``<data dir>/<version>/search.json`` — read when the replica
loads the version, and by every later compaction's base — and applied to the live base at once.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import faiss

from index_shards.search_defaults import SearchDefaults, write_search_defaults
from index_shards.tuning import ShardTask, evaluate_index, sample_index
from retrieval.errors import IndexIntegrityError, InvalidRequest, ShardUnavailable
from retrieval.tuning_choice import decode_queries, encode_queries, encode_result

if TYPE_CHECKING:
    from index_shards.shard import Shard
    from index_shards.versions import ShardVersions

MAX_QUERIES = 5000  # tuning queries one evaluation takes
_THREADS = threading.Lock()  # one evaluation at a time changes the process's FAISS thread count


def _base(versions: ShardVersions, version: str) -> Shard:
    slot = versions.slot(version)
    if slot.shard is None:
        raise ShardUnavailable(f"version {version} of shard {versions.shard_id} is not loaded", field="version")
    return slot.shard


def _cpu_copy(shard: Shard) -> faiss.Index:
    index = shard.index.index
    if shard.index.on_gpu:
        return faiss.index_gpu_to_cpu(index)
    return faiss.clone_index(index)


def sample(versions: ShardVersions, version: str, count: int, seed: int) -> bytes:
    """``count`` stored vectors of the base drawn at random, with their ids (``encode_queries``)."""
    if not 1 <= count <= MAX_QUERIES:
        raise InvalidRequest(f"count must be in 1..{MAX_QUERIES}", field="count")
    base = _base(versions, version)
    queries, ids = sample_index(base.index.index, base.manifest.factory, count, seed)
    return encode_queries(queries, ids)


def evaluate(versions: ShardVersions, version: str, body: bytes, k: int, max_value: int | None) -> bytes:
    """The base's exact and per-candidate answers to the tuning queries in ``body``
    (``encode_queries``), as ``encode_result`` bytes."""
    queries, exclude = decode_queries(body)
    base = _base(versions, version)
    if queries.shape[1] != base.manifest.dim:
        raise InvalidRequest(f"tuning queries of dimension {queries.shape[1]}; version {version} has "
                             f"{base.manifest.dim}", field="body")
    if not 1 <= len(queries) <= MAX_QUERIES or not 1 <= k <= 1000:
        raise InvalidRequest(f"1..{MAX_QUERIES} queries and k in 1..1000", field="k")
    clone = _cpu_copy(base)
    task = ShardTask("", queries, exclude, k, max_value)
    with _THREADS:
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            result = evaluate_index(clone, base.manifest.factory, base.manifest.metric, versions.shard_id, task,
                                    index_bytes=int(faiss.serialize_index(clone).nbytes))
        finally:
            faiss.omp_set_num_threads(threads)
    return encode_result(result)


def set_defaults(versions: ShardVersions, version: str, params: dict[str, Any]) -> dict[str, Any]:
    """Keep and apply a chosen knob (a :class:`SearchDefaults` as a dict); the replica's defaults after."""
    try:
        defaults = SearchDefaults(**params)
    except (TypeError, IndexIntegrityError) as exc:
        raise InvalidRequest(f"search defaults: {exc}", field="body") from exc
    slot = versions.slot(version)
    base = _base(versions, version)
    base.index.set_defaults(defaults.params)  # refused (422) when the index has no such knob
    if slot.live is not None and slot.live.base is not base:
        slot.live.base.index.set_defaults(defaults.params)
    if versions.data_dir is not None:
        write_search_defaults(versions.data_dir / version, defaults)
    return {"shard_id": versions.shard_id, "version": version, "search_defaults": dict(base.index.defaults)}

