"""``shardrag backup`` under a running writer and ``shardrag restore``, on a real local cluster (two
node processes, 2 shards × 2 replicas): the backup's content is exactly the writer's
acknowledged history up to each shard's recorded cut, the restore into a collection of another
shard count has the same digest, and restores into a non-empty collection or one of another
dimension are refused naming why."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from retrieval.backup import digest_of, read_backup
from retrieval.client import ShardragClient
from retrieval.records import DELETE, UPSERT, WalRecord
from serving.cli import main
from serving.local.launcher import LocalCluster
from tests.helpers.integrations import collections_cluster, dropped_after

pytestmark = pytest.mark.slow
DIM = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with collections_cluster(tmp_path_factory.mktemp("backup")) as running:
        yield running


def document(doc_id: str, rng: np.random.Generator, n: int) -> dict[str, Any]:
    vector = rng.standard_normal(DIM).astype(np.float32)
    vector /= np.linalg.norm(vector)
    doc = {"id": doc_id, "title": f"title {n}", "text": f"passage number {n} about item {doc_id}",
           "metadata": {"n": n, "tags": ["a", "b"] if n % 2 else ["c"]}}
    # every seventh is stored without a vector: backed up and restored without one
    return {**doc, "no_vector": True} if n % 7 == 0 else {**doc, "vector": vector.tolist()}


def run_cli(*args: str, capsys) -> tuple[int, dict[str, Any] | None, str]:
    code = main([*args, "--quiet"])
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if out.strip() else None), err


def test_backup_under_a_writer_restores_to_the_same_digest_and_refuses_bad_targets(cluster, tmp_path, capsys):
    url = cluster.gateway_url
    with dropped_after(cluster, "src") as source, dropped_after(cluster, "dst") as target, \
            dropped_after(cluster, "other") as other, ShardragClient(url) as admin:
        admin.create_collection(source, dim=DIM, shards=2, replicas=2, lexical_language="german")
        client = admin.collection(source)
        rng = np.random.default_rng(7)
        initial = {f"doc-{i}": document(f"doc-{i}", rng, i) for i in range(300)}
        for first in range(0, 300, 100):
            client.upsert(list(initial.values())[first:first + 100], write_ack="all")

        history: list[tuple[int, int, str, dict[str, Any]]] = []  # (shard, seq, op, document)
        stop = threading.Event()

        def writer() -> None:
            with ShardragClient(url) as own:
                mine = own.collection(source)
                n = 1000
                while not stop.is_set():
                    n += 1
                    if n % 3 == 0:  # a delete of a live document
                        victim = f"doc-{n % 300}"
                        reply = mine.delete([victim])
                        op, doc = DELETE, {"id": victim}
                    else:  # a new document, or a replaced one
                        doc = document(f"doc-{n % 450}", rng, n)
                        reply = mine.upsert([doc])
                        op = UPSERT
                    for shard, seq in reply["seq"].items():
                        history.append((int(shard), int(seq), op, doc))

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            while len(history) < 30:
                threading.Event().wait(0.05)
            code, made, err = run_cli("backup", "--collection", source, "--to", str(tmp_path / "b"), "--url", url,
                                      capsys=capsys)
            written_during = len(history)
            threading.Event().wait(0.5)  # and the writer goes on after the cut
        finally:
            stop.set()
            thread.join()
        assert code == 0, err
        assert len(history) > written_during >= 30

        # the backup holds exactly the acknowledged history up to each shard's recorded cut
        manifest, _ = read_backup(tmp_path / "b")
        cut = {c.shard: c.seq for c in manifest.shards}
        model = dict(initial)
        for shard, seq, op, doc in sorted(history, key=lambda entry: (entry[0], entry[1])):
            if seq <= cut[shard]:
                if op == DELETE:
                    model.pop(doc["id"], None)
                else:
                    model[doc["id"]] = doc
        assert any(seq > cut[shard] for shard, seq, _, _ in history), "no write came after the cut"
        expected = digest_of(WalRecord(0, UPSERT, d["id"], d["title"], d["text"], d["metadata"],
                                       np.asarray(d["vector"], dtype=np.float32) if "vector" in d else None)
                             for d in model.values())
        assert (manifest.count, manifest.digest) == expected == (made["documents"], made["digest"])

        # restore into a new collection of another shard count: the same digest
        code, restored, err = run_cli("restore", "--from", str(tmp_path / "b"), "--collection", target,
                                      "--shards", "3", "--url", url, capsys=capsys)
        assert code == 0, err
        assert restored["equal"] and restored["digest"] == manifest.digest and restored["documents"] == len(model)
        some = sorted(model)[0]
        got = admin.collection(target).get(some)
        assert (got["text"], got["metadata"]) == (model[some]["text"], model[some]["metadata"])
        assert admin.get_collection(target)["lexical_language"] == "german"  # the definition comes along

        # refused: a non-empty collection, one of another dimension; a directory that is no backup
        code, _, err = run_cli("restore", "--from", str(tmp_path / "b"), "--collection", target, "--url", url,
                               capsys=capsys)
        assert code != 0 and f"holds {len(model)} documents" in err
        admin.create_collection(other, dim=DIM // 2)
        code, _, err = run_cli("restore", "--from", str(tmp_path / "b"), "--collection", other, "--url", url,
                               capsys=capsys)
        assert code != 0 and f"has dim {DIM // 2}" in err
        code, _, err = run_cli("restore", "--from", str(tmp_path), "--collection", "x", "--url", url, capsys=capsys)
        assert code != 0 and "no manifest.json" in err
        code, _, err = run_cli("backup", "--collection", source, "--to", str(tmp_path / "b"), "--url", url,
                               capsys=capsys)
        assert code != 0 and "is not empty" in err
