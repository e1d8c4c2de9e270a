"""Slice-aware training data: rank r reads only shard r; batches are a pure function of
(seed, rank, step); given pairs go to the rank that owns their positive."""

import json

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.docstore import DocStore
from index_shards.layout import resolve_version, shard_dir
from retrieval.errors import ConfigError
from retrieval.types import Document, EmbeddingVersion
from training.config import TrainConfig
from training.data import SliceData
from training.stragglers import StragglerDetector


@pytest.fixture
def collection(tmp_path):
    documents = [Document(f"d{i}", " ".join(f"w{i}_{j}" for j in range(20)), f"Title {i}" if i % 2 else "")
                 for i in range(60)]
    vectors = np.random.default_rng(0).standard_normal((60, 4)).astype(np.float32)
    build_collection(tmp_path, documents, vectors, EmbeddingVersion("e", "1" * 64, 4), BuildConfig("c", 2),
                     show_progress=False)
    return tmp_path


def slice_ids(root, shard):
    directory, _ = resolve_version(root, "c")
    store = DocStore(shard_dir(directory, shard) / "docs.sqlite")
    return {doc.doc_id for _, doc in store.iter_all()}


def test_each_rank_reads_only_its_slice(collection):
    for rank in (0, 1):
        data = SliceData(collection, "c", rank, 2, seed=3)
        assert data.shard_directory.name == f"shard-{rank}"
        assert data.doc_ids == slice_ids(collection, rank)
        seen = {pair.doc_id for step in range(10) for pair in data.batch(step, 8)}
        assert seen <= slice_ids(collection, rank)
    with pytest.raises(ConfigError, match="one rank per slice"):
        SliceData(collection, "c", 0, 3)




def test_pairs_title_to_text_and_crops(collection):
    data = SliceData(collection, "c", 0, 2, seed=1)
    pairs = data.batch(0, len(data))
    for pair in pairs:
        index = int(pair.doc_id[1:])
        if index % 2:  # titled: title → text
            assert pair.query == f"Title {index}" and pair.passage.startswith(f"w{index}_0")
        else:  # untitled: two independent crops of the text, each 10-50 % of its 20 words
            for crop in (pair.query, pair.passage):
                words = crop.split()
                assert 2 <= len(words) <= 10 and all(w.startswith(f"w{index}_") for w in words)


def test_batches_are_deterministic_and_epochs_reshuffle(collection):
    a = SliceData(collection, "c", 1, 2, seed=5)
    b = SliceData(collection, "c", 1, 2, seed=5)
    assert [a.batch(s, 7) for s in range(12)] == [b.batch(s, 7) for s in range(12)]
    other_seed = SliceData(collection, "c", 1, 2, seed=6)
    assert a.batch(0, 7) != other_seed.batch(0, 7)
    n = len(a)
    first_epoch = [p.doc_id for p in a.batch(0, n)]
    second_epoch = [p.doc_id for p in a.batch(1, n)]
    assert sorted(first_epoch) == sorted(second_epoch) and first_epoch != second_epoch


def test_given_pairs_are_routed_to_the_positives_slice(collection, tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text("\n".join(json.dumps({"_id": f"q{i}", "text": f"question {i}"}) for i in range(60)))
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "\n".join(f"q{i}\td{i}\t1" for i in range(60)) + "\nq0\td1\t0\n")
    routed = {}
    for rank in (0, 1):
        data = SliceData(collection, "c", rank, 2, train_queries=str(queries), train_qrels=str(qrels))
        routed[rank] = {pair.doc_id for pair in data.given}
        assert routed[rank] == slice_ids(collection, rank)
        assert all(pair.query == f"question {pair.doc_id[1:]}" for pair in data.given)
    assert routed[0].isdisjoint(routed[1]) and len(routed[0] | routed[1]) == 60


def test_straggler_detector():
    detector = StragglerDetector(3, factor=1.5, window=3)
    assert detector.record([1.0, 1.0, 2.0]) == []  # not a full window yet
    detector.record([1.0, 1.1, 2.0])
    assert detector.record([1.0, 0.9, 1.9]) == [2]
    for _ in range(3):
        flagged = detector.record([1.0, 1.0, 1.2])
    assert flagged == []
    pair = StragglerDetector(2, factor=1.5, window=2)  # two ranks: judged against the other one
    pair.record([1.0, 1.6])
    assert pair.record([1.0, 1.6]) == [1]  # 1.6× its peer (the median of both would need 3×)
    assert pair.record([1.0, 1.2]) == []  # the window's mean falls to 1.4× its peer


def test_config_validation():
    with pytest.raises(ConfigError):
        TrainConfig(root="r", collection="c", batch_size=0).validate()
    with pytest.raises(ConfigError):
        TrainConfig(root="r", collection="c", train_queries="q.jsonl").validate()
    with pytest.raises(ConfigError):
        TrainConfig(root="r", collection="c", comm_hook="zip").validate()
    config = TrainConfig(root="r", collection="c")
    assert TrainConfig.from_dict(config.to_dict()) == config
