"""A replica that has served a lexical query builds its bases' lexical indexes ahead of the
queries (index_shards.lexical_warm): after a restart (in the background, dense served at once), a
staged version (ready only with it), a compaction and a snapshot restore — and remembers it across
restarts. ``lazy`` keeps the first-use build; ``always`` builds from the start."""

import time

import numpy as np
import pytest

from index_shards import compaction, snapshots
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.lexical_warm import USED_MARKER, LexicalWarmth, build_base_lexicon
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.writes import accept
from retrieval.bm25 import LexicalQuery
from retrieval.contract import SearchParams
from retrieval.errors import ConfigError
from retrieval.records import UPSERT, WalRecord
from retrieval.types import EmbeddingVersion
from tests.conftest import random_corpus

DIM = 8


@pytest.fixture
def built(tmp_path):
    documents, vectors, version = random_corpus(n=300, dim=DIM)
    root = tmp_path / "root"
    build_collection(root, documents, vectors, version, BuildConfig("c", 1, factory="Flat"), show_progress=False)
    directory, _ = resolve_version(root, "c")
    return root, shard_dir(directory, 0), documents, vectors


def open_replica(directory, data_dir, **kwargs) -> ShardVersions:
    return ShardVersions(Shard.load(directory, device="cpu"), data_dir=data_dir, **kwargs)


def lexical_search(replica: ShardVersions, text: str = "document 17", version: str | None = None) -> list[str]:
    reply = replica.search(np.zeros((0, DIM)), SearchParams(5, version, lexical=True), [LexicalQuery(text, None)])
    return list(reply.results[0]["doc_ids"])


def served_base(replica: ShardVersions, version: str | None = None) -> Shard:
    slot = replica.slot(version)
    assert slot.shard is not None
    return slot.shard


def test_a_replica_that_served_a_lexical_query_comes_back_with_its_index_built(built, tmp_path):
    _, directory, _, vectors = built
    data_dir = tmp_path / "data"
    replica = open_replica(directory, data_dir)
    assert replica.warming is None and not served_base(replica).has_lexicon  # nothing asked for it yet
    assert not (data_dir / USED_MARKER).exists()
    replica.search(vectors[:1], SearchParams(5, None))  # a dense query is not a lexical one
    assert not (data_dir / USED_MARKER).exists()
    before = lexical_search(replica)
    assert (data_dir / USED_MARKER).is_file()
    replica.close()

    restarted = open_replica(directory, data_dir)
    assert restarted.warming is not None  # built in the background: dense queries are served meanwhile
    assert restarted.search(vectors[:1], SearchParams(5, None)).results[0]["doc_ids"]
    restarted.warming.join(timeout=60)
    base = served_base(restarted)
    assert base.has_lexicon and base.lexicon_state == "built"
    described = restarted.describe()[0]
    assert described.lexical_index == "built"
    assert described.lexical_index_bytes == base.lexicon.nbytes > 0
    assert described.lexical_index_build_s is not None and described.lexical_index_build_s > 0
    assert lexical_search(restarted) == before  # the same index, only built earlier
    restarted.close()


def test_lazy_replicas_build_on_first_use_and_always_ones_from_the_start(built, tmp_path):
    _, directory, _, _ = built
    data_dir = tmp_path / "data"
    replica = open_replica(directory, data_dir, lexical_warm="lazy")
    lexical_search(replica)
    replica.close()
    lazy = open_replica(directory, data_dir, lexical_warm="lazy")  # the marker is there; lazy ignores it
    assert lazy.warming is None and served_base(lazy).lexicon_state == "none"
    described = lazy.describe()[0]
    assert described.lexical_index == "none"
    assert described.lexical_index_bytes is None and described.lexical_index_build_s is None
    lazy.close()

    fresh = open_replica(directory, tmp_path / "fresh", lexical_warm="always")  # no lexical query ever served
    assert fresh.warming is not None
    fresh.warming.join(timeout=60)
    assert served_base(fresh).has_lexicon
    fresh.close()
    with pytest.raises(ConfigError, match="lexical_warm"):
        LexicalWarmth("eager")


def test_a_staged_version_is_ready_only_with_its_lexical_index(built, tmp_path):
    root, directory, documents, vectors = built
    replica = open_replica(directory, tmp_path / "data")
    first = replica.ready_ids()[0]
    lexical_search(replica)
    other = EmbeddingVersion("other", "1" * 64, DIM)
    build_collection(root, documents, vectors[::-1].copy(), other, BuildConfig("c", 1, factory="Flat"),
                     show_progress=False)
    slot = replica.stage(other.id)
    for _ in range(600):
        if slot.state != "loading":
            break
        time.sleep(0.05)
    assert slot.state == "ready", slot.error
    assert served_base(replica, other.id).has_lexicon  # built before it was ready: its first query waits for nothing
    assert lexical_search(replica, version=other.id) == lexical_search(replica, version=first)
    replica.close()


def test_compaction_and_a_snapshot_restore_bring_the_index_along(built, tmp_path):
    _, directory, _, vectors = built
    replica = open_replica(directory, tmp_path / "data")
    version = replica.ready_ids()[0]
    lexical_search(replica)
    records = [WalRecord(1 + i, UPSERT, f"new-{i}", "", f"written document {i}", {}, vectors[i]) for i in range(20)]
    accept(replica, version, 0, None, records)
    assert compaction.compact(replica, version)["compacted"] == 20
    assert served_base(replica).has_lexicon  # the new base's, built before it was swapped in

    # a peer that has served lexical queries takes the snapshot: its new base is warmed in the background
    peer = open_replica(directory, tmp_path / "peer")
    lexical_search(peer)
    snapshots.restore(peer, version, snapshots.take(replica, version))
    base = served_base(peer)
    assert base is not served_base(replica)
    for _ in range(600):
        if base.has_lexicon:
            break
        time.sleep(0.05)
    assert base.has_lexicon
    assert lexical_search(peer, "written document 3") == lexical_search(replica, "written document 3")
    peer.close()
    replica.close()


def test_a_base_built_in_a_child_process_is_the_same_index(built, caplog):
    _, directory, _, _ = built
    shard = Shard.load(directory, device="cpu")
    here = build_base_lexicon(shard.docstore, apart_min_docs=10**9)
    apart = build_base_lexicon(shard.docstore, apart_min_docs=1)  # a spawned process reads the store itself
    assert "in a child process failed" not in caplog.text  # (it falls back to this process, warning)
    assert apart.vocabulary == here.vocabulary and apart.count == here.count == 300
    for name in ("int_ids", "lengths", "starts", "rows", "tfs"):
        mine, theirs = getattr(here, name), getattr(apart, name)
        assert theirs.dtype == mine.dtype and np.array_equal(theirs, mine), name


def test_the_shard_server_reports_its_lexical_index_in_metrics_and_versions(built, tmp_path):
    from fastapi.testclient import TestClient

    from index_shards.server import ShardServerConfig, create_app

    _, directory, _, _ = built
    replica = open_replica(directory, tmp_path / "data", lexical_warm="lazy")
    version = replica.ready_ids()[0]
    with TestClient(create_app(replica, ShardServerConfig())) as client:
        def gauge(name: str) -> float:
            line = next(row for row in client.get("/metrics").text.splitlines()
                        if row.startswith(f'{name}{{version="{version}"}}'))
            return float(line.rsplit(" ", 1)[1])

        assert gauge("shardrag_shard_lexical_index_bytes") == 0.0  # not built: nothing asked for it
        assert gauge("shardrag_shard_lexical_index_building") == 0.0
        assert client.get("/admin/versions").json()["versions"][0]["lexical_index"] == "none"
        lexical_search(replica)
        base = served_base(replica)
        assert gauge("shardrag_shard_lexical_index_bytes") == base.lexicon.nbytes > 0
        assert gauge("shardrag_shard_lexical_index_build_seconds") == pytest.approx(base.lexicon_build_s)
        row = client.get("/admin/versions").json()["versions"][0]
        assert row["lexical_index"] == "built" and row["lexical_index_bytes"] == base.lexicon.nbytes
