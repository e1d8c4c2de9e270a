"""Compaction and recovery of one replica's write state (ShardVersions with a data dir): a
compacted base answers exactly like a from-scratch build of the same documents; a restart at any
point (after the base is written, after the checkpoint, with writes made during compaction) comes
back with every write; a checkpoint whose WAL is missing writes stops the replica by name."""

import os

import numpy as np
import pytest

from index_shards import compaction
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.wal import WalCorrupted, WriteAheadLog
from index_shards.writes import accept
from retrieval.contract import SearchParams
from retrieval.errors import HeldElsewhere, IndexIntegrityError
from retrieval.records import UPSERT, WalRecord
from retrieval.routing import doc_int_id
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


def write(replica: ShardVersions, version: str, records) -> int:
    """Records as a replica takes them from its primary (term 0: these tests run no election)."""
    return accept(replica, version, 0, None, records)


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
    write(replica, version, writes(rng, model, 1, 200))
    done = compaction.compact(replica, version)
    assert done["base_seq"] == 200 and done["count"] == len(model) and done["compacted"] > 0
    live = replica.get(version)
    assert live.segment_size == 0 and live.tombstones == 0 and live.base_seq == 200
    assert_matches_model(replica, model, rng, factory)
    write(replica, version, writes(rng, model, 201, 50))  # writes go on after compaction
    assert_matches_model(replica, model, rng, factory)

    # a from-scratch build of the same documents, in the same order, answers identically
    docs = list(live.documents())
    fresh_vectors = np.stack([d.vector for d in docs])
    build_collection(tmp_path / "fresh", [Document(d.doc_id, d.text, d.title, d.metadata) for d in docs],
                     fresh_vectors, live.base.manifest.embedding_version, BuildConfig("c", 1, factory=factory),
                     show_progress=False)
    fresh_dir, _ = resolve_version(tmp_path / "fresh", "c")
    compaction.compact(replica, version)
    fresh = ShardVersions(Shard.load(shard_dir(fresh_dir, 0), device="cpu"))
    queries = rng.standard_normal((30, DIM)).astype(np.float32)
    ours = replica.search(queries, SearchParams(10, None)).results
    theirs = fresh.search(queries, SearchParams(10, None)).results
    assert [h["doc_ids"] for h in ours] == [h["doc_ids"] for h in theirs]
    assert np.allclose([h["scores"] for h in ours], [h["scores"] for h in theirs])

    # and a restart comes back from the checkpoint, with the seqs GET reports
    replica.close()
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
    write(replica, version, writes(rng, model, 1, 150))
    with pytest.raises(Crash):
        compaction.compact(replica, version)
    replica.close()
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
        write(replica, version, records)
    replica.close()
    restarted = open_replica(directory, data_dir)
    assert restarted.get(version).applied_seq == 40
    assert_matches_model(restarted, model, rng, factory)
    assert write(restarted, version, records) == 40  # the gateway's retry applies nothing twice


def test_a_checkpoint_past_a_missing_wal_stops_the_replica(built):
    directory, model, data_dir, _ = built
    replica = open_replica(directory, data_dir, wal_retain=0)
    version = replica.ready_ids()[0]
    rng = np.random.default_rng(11)
    write(replica, version, writes(rng, model, 1, 30))
    compaction.compact(replica, version)
    later = writes(rng, model, 31, 10)
    write(replica, version, later)
    # the log loses writes 31..35 (a bad restore): the base holds up to 30, the WAL resumes at 36
    replica.close()
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


def test_a_second_process_on_the_same_data_dir_is_refused_naming_the_holder(built):
    directory, _, data_dir, _ = built
    replica = open_replica(directory, data_dir)
    with pytest.raises(HeldElsewhere, match=f"pid {os.getpid()}"):
        open_replica(directory, data_dir)
    replica.close()
    open_replica(directory, data_dir).close()  # free again once the holder is gone


@pytest.mark.parametrize("factory", ["IVF8,PQ4", "IVF8,SQ8"])
def test_compacting_a_compressed_index_again_and_again_adds_no_error(tmp_path, factory):
    """Issue 33, item 7: compaction rebuilt the index from decoded vectors, so PQ/SQ error
    compounded (0.27 → 0.44 after three compactions of IVF8,PQ4). Now the build's codes are kept
    and written documents are encoded once from their originals: every compaction decodes to the
    same vectors."""
    documents, vectors, version = random_corpus(n=300, dim=DIM)
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("c", 1, factory=factory),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path / "root", "c")
    replica = open_replica(shard_dir(directory, 0), tmp_path / "data")
    version_id = replica.ready_ids()[0]
    rng = np.random.default_rng(3)
    originals = {d.doc_id: vectors[i] for i, d in enumerate(documents)}
    decoded_after = []
    for round_ in range(3):
        fresh = []
        for n in range(20):
            vector = rng.standard_normal(DIM).astype(np.float32)
            vector /= np.linalg.norm(vector)
            doc_id = f"w{round_}-{n}"
            originals[doc_id] = vector
            fresh.append(WalRecord(round_ * 20 + n + 1, UPSERT, doc_id, "", "t", {}, vector))
        write(replica, version_id, fresh)
        compaction.compact(replica, version_id)
        live = replica.get(version_id)
        ids = sorted(originals)[:150] + [f"w0-{n}" for n in range(20)]
        decoded_after.append(np.stack([live.base.filtered.vectors(np.asarray([doc_int_id(i)]))[0] for i in ids]))
        assert all(np.array_equal(live.get(f"w0-{n}", with_vector=True).vector, originals[f"w0-{n}"])
                   for n in range(20))  # the originals are kept beside the codes
    first_error = np.linalg.norm(decoded_after[0] - np.stack([originals[i] for i in ids]), axis=1).mean()
    assert first_error > 0  # a compressed index: decoding is approximate
    for later in decoded_after[1:]:
        assert np.array_equal(later, decoded_after[0])  # ... but never worse after another compaction
    replica.close()


def test_a_compacted_base_keeps_the_partition_field(tmp_path):
    """A created collection's tenant field travels in the shard manifest: the base a compaction
    writes carries it, so searches pinned to one tenant stay inside its documents afterwards."""
    documents, vectors, version = random_corpus(n=50, dim=DIM)
    build_collection(tmp_path / "root", documents, vectors, version,
                     BuildConfig("c", 1, partition_field="tenant"), show_progress=False)
    directory, _ = resolve_version(tmp_path / "root", "c")
    replica = open_replica(shard_dir(directory, 0), tmp_path / "data")
    version_id = replica.ready_ids()[0]
    rng = np.random.default_rng(2)
    write(replica, version_id, [WalRecord(seq, UPSERT, f"w{seq}", "", "", {"tenant": "a"},
                                          rng.standard_normal(DIM).astype(np.float32)) for seq in range(1, 21)])
    assert compaction.compact(replica, version_id)["base_seq"] == 20
    assert replica.get(version_id).base.manifest.partition_field == "tenant"
    replica.close()
    assert open_replica(shard_dir(directory, 0), tmp_path / "data").get(version_id).base.manifest.partition_field \
        == "tenant"


def test_tuned_search_defaults_outlive_compactions_and_a_replicas_own_win(tmp_path):
    """`shardrag tune`'s value (the build's search.json) survived a load but not a compaction: the
    compacted base searched with FAISS's own ef_search. Now a compacted base keeps the build's, and
    a replica's own (a REST tune, in its data dir) wins over both, across a restart."""
    from index_shards import live_tuning
    from index_shards.search_defaults import SearchDefaults, write_search_defaults

    documents, vectors, version = random_corpus(n=300, dim=DIM)
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("c", 1, factory="HNSW32"),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path / "root", "c")
    write_search_defaults(directory, SearchDefaults(ef_search=48))
    replica = open_replica(shard_dir(directory, 0), tmp_path / "data")
    version_id = replica.get(None).version_id
    write(replica, version_id, writes(np.random.default_rng(0), {}, 1, 20))
    compaction.compact(replica, version_id)
    assert replica.slot(version_id).shard.index.defaults == {"ef_search": 48}
    live_tuning.set_defaults(replica, version_id, {"ef_search": 96, "recall_target": 0.95})
    assert replica.slot(version_id).shard.index.defaults == {"ef_search": 96}
    with pytest.raises(Exception, match="nprobe"):  # a knob an HNSW index does not have: refused, nothing kept
        live_tuning.set_defaults(replica, version_id, {"nprobe": 4})
    replica.close()
    again = open_replica(shard_dir(directory, 0), tmp_path / "data")
    assert again.slot(version_id).shard.index.defaults == {"ef_search": 96}
    again.close()


def test_documents_without_vectors_live_through_compaction_restart_and_snapshot(built, tmp_path):
    """no_vector documents: listed, read, filtered and found by BM25, never by a dense search (plain,
    filtered, with tombstones), before and after a compaction, a restart and a snapshot install; a
    document may turn from one kind into the other."""
    from index_shards import snapshots
    from retrieval.bm25 import LexicalQuery
    from retrieval.filters import parse_filter

    directory, model, data_dir, factory = built
    replica = open_replica(directory, data_dir)
    version = replica.ready_ids()[0]
    rng = np.random.default_rng(11)
    seq = 0

    def upsert(doc_id: str, vector) -> None:
        nonlocal seq
        seq += 1
        metadata = {"kind": "bare" if vector is None else "dense", "at": f"2024-01-{1 + seq % 28:02d}"}
        model[doc_id] = (f"t{seq}", f"zebra stripes {seq}", metadata, vector)
        write(replica, version, [WalRecord(seq, UPSERT, doc_id, f"t{seq}", f"zebra stripes {seq}", metadata,
                                           vector)])

    def check() -> None:
        live = replica.get(version)
        held = {d.doc_id: d for d in live.documents()}
        assert set(held) == set(model)
        for doc_id, (_, text, metadata, vector) in model.items():
            assert (held[doc_id].text, held[doc_id].metadata) == (text, metadata)
            assert (held[doc_id].vector is None) == (vector is None)
        bare = {d for d, (_, _, _, v) in model.items() if v is None}
        vectored = {d: m for d, m in model.items() if m[3] is not None}
        queries = rng.standard_normal((5, DIM)).astype(np.float32)
        for data in (None, {"must": [{"key": "kind", "match": {"any": ["bare", "dense"]}}]}):
            reply = replica.search(queries, SearchParams(50, None, filter=parse_filter(data).canonical() if data
                                                         else None, ef_search=400 if factory != "Flat" else None))
            for query, hits in zip(queries, reply.results, strict=True):
                assert not set(hits["doc_ids"]) & bare
                if factory == "Flat":
                    filter_ = parse_filter(data) if data else None
                    assert hits["doc_ids"] == brute_force(vectored, query, 50, filter_)
        total, page = live.scan(parse_filter({"must": [{"key": "kind", "match": {"value": "bare"}}]}), "", 1000)
        assert total == len(bare) and [d.doc_id for d in page] == sorted(bare)
        assert all(d.vector is None for d in page)
        lexical = replica.search(np.zeros((0, DIM), dtype=np.float32), SearchParams(100, None, lexical=True),
                                 lexical=[LexicalQuery("zebra")])
        assert bare <= set(lexical.results[0]["doc_ids"])

    for i in range(6):
        upsert(f"bare-{i}", None)
    upsert("dense-0", rng.standard_normal(DIM).astype(np.float32))
    check()
    compaction.compact(replica, version)
    assert replica.get(version).segment_size == 0
    check()
    upsert("bare-0", rng.standard_normal(DIM).astype(np.float32))  # a base bare document gets a vector
    upsert("dense-0", None)  # and a vectored one loses its
    seq += 1
    model.pop("bare-1")
    write(replica, version, [WalRecord(seq, 2, "bare-1")])
    check()
    replica.close()
    replica = open_replica(directory, data_dir)  # the WAL replayed over the compacted base
    check()
    compaction.compact(replica, version)
    check()
    digest = replica.get(version).digest()
    other = open_replica(directory, tmp_path / "other")
    snapshots.restore(other, version, snapshots.take(replica, version))
    assert other.get(version).digest() == digest
    replica.close()
    replica = other
    check()
