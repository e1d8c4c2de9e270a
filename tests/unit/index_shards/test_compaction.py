"""Compaction and recovery of one replica's write state (ShardVersions with a data dir): a
compacted base answers exactly like a from-scratch build of the same documents; a restart at any
point (after the base is written, after the checkpoint, with writes made during compaction) comes
back with every write; a checkpoint whose WAL is missing writes stops the replica by name."""

import numpy as np
import pytest

from index_shards import compaction
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.wal import WalCorrupted, WriteAheadLog
from retrieval.contract import SearchParams
from retrieval.errors import IndexIntegrityError
from retrieval.types import Document
from tests.conftest import random_corpus
from tests.unit.index_shards.test_live_shard import DIM, brute_force, writes


class Crash(Exception):
    pass


def crash_at(point: str):
    def hook(reached: str) -> None:
        if reached == point:
            raise Crash(point)
    return hook


@pytest.fixture(params=["Flat", "HNSW32"])
def built(request, tmp_path):
    documents, vectors, version = random_corpus(n=300, dim=DIM)
    build_collection(tmp_path / "root", documents, vectors, version,
                     BuildConfig("c", 1, factory=request.param), show_progress=False)
    directory, _ = resolve_version(tmp_path / "root", "c")
    model = {d.doc_id: (d.title, d.text, dict(d.metadata), vectors[i]) for i, d in enumerate(documents)}
    return shard_dir(directory, 0), model, tmp_path / "data", request.param


def open_replica(directory, data_dir, **kwargs) -> ShardVersions:
    return ShardVersions(Shard.load(directory, device="cpu"), data_dir=data_dir, **kwargs)


def assert_matches_model(replica: ShardVersions, model, rng, factory: str) -> None:
    live = replica.get(None)
    held = {d.doc_id: d for d in live.documents()}
    assert set(held) == set(model)
    for doc_id, (title, text, metadata, vector) in model.items():
        assert (held[doc_id].title, held[doc_id].text, held[doc_id].metadata) == (title, text, metadata)
        assert np.array_equal(held[doc_id].vector, vector)  # bit for bit
    queries = rng.standard_normal((20, DIM)).astype(np.float32)
    reply = replica.search(queries, SearchParams(10, None, ef_search=400 if factory != "Flat" else None))
    for query, hits in zip(queries, reply.results, strict=True):
        expected = brute_force(model, query, 10)
        if factory == "Flat":
            assert hits["doc_ids"] == expected
        else:
            assert len(set(hits["doc_ids"]) & set(expected)) >= 9


def test_compaction_folds_writes_and_answers_like_a_fresh_build(built, tmp_path):
    directory, model, data_dir, factory = built
    replica = open_replica(directory, data_dir)
    version = replica.ready_ids()[0]
    rng = np.random.default_rng(5)
    replica.write(version, writes(rng, model, 1, 200))
    done = replica.compact(version)
    assert done["base_seq"] == 200 and done["count"] == len(model) and done["compacted"] > 0
    live = replica.get(version)
    assert live.segment_size == 0 and live.tombstones == 0 and live.base_seq == 200
    assert_matches_model(replica, model, rng, factory)
    replica.write(version, writes(rng, model, 201, 50))  # writes go on after compaction
    assert_matches_model(replica, model, rng, factory)

    # a from-scratch build of the same documents, in the same order, answers identically
    docs = list(live.documents())
    fresh_vectors = np.stack([d.vector for d in docs])
    build_collection(tmp_path / "fresh", [Document(d.doc_id, d.text, d.title, d.metadata) for d in docs],
                     fresh_vectors, live.base.manifest.embedding_version, BuildConfig("c", 1, factory=factory),
                     show_progress=False)
    fresh_dir, _ = resolve_version(tmp_path / "fresh", "c")
    replica.compact(version)
    fresh = ShardVersions(Shard.load(shard_dir(fresh_dir, 0), device="cpu"))
    queries = rng.standard_normal((30, DIM)).astype(np.float32)
    ours = replica.search(queries, SearchParams(10, None)).results
    theirs = fresh.search(queries, SearchParams(10, None)).results
    assert [h["doc_ids"] for h in ours] == [h["doc_ids"] for h in theirs]
    assert np.allclose([h["scores"] for h in ours], [h["scores"] for h in theirs])

    # and a restart comes back from the checkpoint, with the seqs GET reports
    replica = open_replica(directory, data_dir)
    assert replica.get(version).base_seq == 250
    assert_matches_model(replica, model, rng, factory)
    some = next(d for d in replica.get(version).documents() if d.seq > 0)
    assert replica.get(version).get(some.doc_id).seq == some.seq


@pytest.mark.parametrize("point", ["mid_compaction", "after_checkpoint"])
def test_a_crash_during_compaction_loses_nothing(built, point):
    directory, model, data_dir, factory = built
    replica = open_replica(directory, data_dir, crash_point=crash_at(point))
    version = replica.ready_ids()[0]
    rng = np.random.default_rng(7)
    replica.write(version, writes(rng, model, 1, 150))
    with pytest.raises(Crash):
        replica.compact(version)
    restarted = open_replica(directory, data_dir)
    expected_base = 150 if point == "after_checkpoint" else 0
    assert restarted.get(version).base_seq == expected_base
    assert restarted.get(version).applied_seq == 150
    assert_matches_model(restarted, model, rng, factory)
    leftovers = [p.name for p in (data_dir / version).iterdir() if p.is_dir()]
    assert leftovers == (["base-150"] if point == "after_checkpoint" else [])  # the half-made base is gone


def test_a_crash_between_wal_append_and_apply_keeps_the_write(built):
    directory, model, data_dir, factory = built
    replica = open_replica(directory, data_dir, crash_point=crash_at("after_wal_append"))
    version = replica.ready_ids()[0]
    rng = np.random.default_rng(9)
    records = writes(rng, model, 1, 40)
    with pytest.raises(Crash):  # durable but never acknowledged: replayed at restart, as the WAL says
        replica.write(version, records)
    restarted = open_replica(directory, data_dir)
    assert restarted.get(version).applied_seq == 40
    assert_matches_model(restarted, model, rng, factory)
    assert restarted.write(version, records) == 40  # the gateway's retry applies nothing twice


def test_a_checkpoint_past_a_missing_wal_stops_the_replica(built):
    directory, model, data_dir, _ = built
    replica = open_replica(directory, data_dir, wal_retain=0)
    version = replica.ready_ids()[0]
    rng = np.random.default_rng(11)
    replica.write(version, writes(rng, model, 1, 30))
    replica.compact(version)
    later = writes(rng, model, 31, 10)
    replica.write(version, later)
    # the log loses writes 31..35 (a bad restore): the base holds up to 30, the WAL resumes at 36
    for path in (data_dir / version).glob("wal-*.log"):
        path.unlink()
    damaged = WriteAheadLog(data_dir / version)
    damaged.open()
    damaged.last_seq = 35
    damaged.append(later[5:])
    damaged.close()
    with pytest.raises(WalCorrupted, match="31..35 are missing"):
        open_replica(directory, data_dir)
    # a checkpoint naming a base that is not there is refused by name, too
    (data_dir / version / compaction.CHECKPOINT_FILE).write_text('{"base": "base-99", "seq": 99}')
    with pytest.raises(IndexIntegrityError, match="base-99"):
        open_replica(directory, data_dir)
