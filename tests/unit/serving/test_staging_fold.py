"""How a staged version's replay folds the active version's writes (issue 33, item 3): staging kept
"the last record per id" across shards, so on a kmeans collection every document whose home was
not the last shard was sent to the new version as a DELETE (the upsert on its home shard comes
with a delete on every other shard). Newest record per shard, an upsert on any shard wins, and a
delete because the document moved is never a delete of it."""

import numpy as np

from retrieval.records import DELETE, UPSERT, WalRecord
from serving.writes.staging import fold


def upsert(seq: int, doc_id: str, text: str) -> WalRecord:
    return WalRecord(seq, UPSERT, doc_id, "", text, {}, np.zeros(4, dtype=np.float32))


def test_a_kmeans_upsert_homed_on_any_shard_survives_its_moved_deletes_elsewhere():
    # one write per document: the home shard takes the upsert, every other shard a "moved" delete
    newest = [
        {"a": upsert(1, "a", "a@0"), "b": WalRecord(1, DELETE, "b", moved=True), "c": WalRecord(2, DELETE, "c",
                                                                                                moved=True)},
        {"a": WalRecord(1, DELETE, "a", moved=True), "b": upsert(1, "b", "b@1"), "c": WalRecord(2, DELETE, "c",
                                                                                                moved=True)},
        {"a": WalRecord(1, DELETE, "a", moved=True), "b": WalRecord(1, DELETE, "b", moved=True),
         "c": upsert(2, "c", "c@2")},
    ]
    upserts, deletes = fold({"a", "b", "c"}, newest)
    assert sorted((r.doc_id, r.text) for r in upserts) == [("a", "a@0"), ("b", "b@1"), ("c", "c@2")]
    assert deletes == []


def test_a_document_that_moved_twice_takes_its_newest_home():
    # seq order per shard: shard 0 saw the upsert, then the move away; shard 1 the move, then the upsert
    newest = [{"x": WalRecord(5, DELETE, "x", moved=True)}, {"x": upsert(7, "x", "x@1")}]
    upserts, deletes = fold({"x"}, newest)
    assert [(r.doc_id, r.text) for r in upserts] == [("x", "x@1")] and deletes == []


def test_a_real_delete_deletes_and_a_move_alone_changes_nothing():
    newest = [{"gone": WalRecord(3, DELETE, "gone"), "moved": WalRecord(4, DELETE, "moved", moved=True)},
              {"gone": WalRecord(2, DELETE, "gone")}]
    upserts, deletes = fold({"gone", "moved"}, newest)
    assert upserts == [] and deletes == ["gone"]  # "moved" lives where the build read it


def test_hash_partitions_keep_the_newest_record_of_the_one_shard():
    newest = [{"h": upsert(9, "h", "second")}, {}]
    assert [r.text for r in fold({"h"}, newest)[0]] == ["second"]
