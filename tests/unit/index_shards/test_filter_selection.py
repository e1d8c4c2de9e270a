"""A filter's selection read by storage position (a bitmap; index_shards/selection.py) answers
exactly as the same filter read by id (FAISS's hash-set selector): the same ids, order and
distances from HNSW's walk and probe, Flat's exact top k, IVF's per-list counts and its scans
under a selector of the scanned lists' ids (flat and fast-scan PQ codes) — also with
tombstones, documents without a vector and a payload order unlike the index's."""

import numpy as np
import pytest

from index_shards import filtered
from index_shards import selection as selection_module
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.selection import PayloadFrame, Selection
from index_shards.shard import Shard
from retrieval.filters import parse_filter
from retrieval.types import Document, EmbeddingVersion

N, DIM, K = 3000, 32, 10


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(3)
    centers = rng.standard_normal((6, DIM)).astype(np.float32)
    topic = rng.integers(0, 6, N)
    vectors = centers[topic] + 0.6 * rng.standard_normal((N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    documents = [Document(f"doc-{i}", f"text {i}", "", {"topic": int(topic[i]), "u": int(rng.integers(0, 1000))})
                 for i in range(N)]
    version = EmbeddingVersion("selection", "s" * 64, DIM)
    dirs = {}
    for factory in ("Flat", "HNSW32", "IVF16,Flat", "IVF16,PQ16x4fs"):
        root = tmp_path_factory.mktemp(factory.replace(",", "_"))
        build_collection(root, documents, vectors, version, BuildConfig("c", 1, factory=factory), show_progress=False)
        directory, _ = resolve_version(root, "c")
        dirs[factory] = shard_dir(directory, 0)
    return documents, vectors, topic, dirs


def load(directory, *, bare=(), positional=True) -> Shard:
    shard = Shard.load(directory, device="cpu")
    shard.bare = np.sort(np.asarray(bare, dtype=np.int64))
    shard.filtered.exact_scan_max = 0  # every search takes the in-index path unless the plan scans
    if not positional:  # the id path: one IDSelectorBatch of every kept id (over the id map)
        shard.filtered._positional = shard.filtered._listed = False
    return shard


FILTERS = (
    {"must": [{"key": "topic", "match": {"value": 2}}]},  # one topic: near some queries, far from others
    {"must_not": [{"key": "topic", "match": {"value": 2}}]},  # most of the shard
    {"must": [{"key": "u", "range": {"lt": 500}}]},  # half, unrelated to the vectors
    {"must": [{"key": "u", "range": {"lt": 950}}]},  # 95 %: the rejected ids are the smaller set
)


def int_ids(shard, doc_ids):
    position = {d: i for i, d in enumerate(shard.payload.ordered()[0])}
    ordered_ids, positions = shard.payload.ordered()
    return np.asarray([shard.payload.int_ids[positions[position[d]]] for d in doc_ids], dtype=np.int64)


def test_the_payload_order_differs_from_the_index_order(built):
    """(Else the storage map below would be the identity and prove nothing.)"""
    *_, dirs = built
    shard = load(dirs["HNSW32"])
    frame = shard.filtered.frame(shard.payload.int_ids, shard.bare)
    assert frame.payload_of_storage is not None
    assert not np.array_equal(frame.payload_of_storage, np.arange(N))


@pytest.mark.parametrize("factory", ["HNSW32", "Flat", "IVF16,Flat", "IVF16,PQ16x4fs"])
def test_a_bitmap_by_storage_position_answers_as_the_id_selector(built, factory, monkeypatch):
    """(IVF, fast-scan PQ too: its selector holds the kept ids of the lists each call scans, not
    all of them.)"""
    documents, vectors, topic, dirs = built
    rng = np.random.default_rng(5)
    probe = load(dirs[factory])
    some = int_ids(probe, [documents[i].doc_id for i in rng.choice(N, 300, replace=False)])
    bare, exclude = some[:100], np.concatenate([some[100:], [12345678901]])  # (an id the shard lacks)
    by_position = load(dirs[factory], bare=bare)
    by_id = load(dirs[factory], bare=bare, positional=False)
    assert by_position.filtered._positional or by_position.filtered._listed
    assert not (by_id.filtered._positional or by_id.filtered._listed)
    queries = vectors[rng.choice(N, 12, replace=False)] + 0.01
    knobs = {"HNSW32": {"ef_search": 32}}.get(factory, {"nprobe": 2} if factory.startswith("IVF") else {})
    gone = set(bare.tolist()) | set(exclude.tolist())
    # (an IVF row's scan otherwise stops at twice the kept documents it needs: a narrower scan than
    # the id path's, tested below — here the same lists, to compare the selectors alone)
    monkeypatch.setattr(filtered, "SCAN_SLACK", 10**9)
    listed_calls = []  # (a spy: which IVF searches built their selector from the scanned lists)
    original = Selection.ids_in_lists
    monkeypatch.setattr(Selection, "ids_in_lists",
                        lambda self, lists: listed_calls.append(lists.size) or original(self, lists))
    for data in FILTERS:
        filter_ = parse_filter(data)
        got_scores, got = by_position.search_ids(queries, K, filter_=filter_, exclude=exclude, **knobs)
        want_scores, want = by_id.search_ids(queries, K, filter_=filter_, exclude=exclude, **knobs)
        assert np.array_equal(got, want), data
        assert np.allclose(got_scores, want_scores, atol=1e-6), data
        assert not gone & set(got.ravel().tolist())
        kept = by_id.payload.int_ids[by_id.payload.mask(filter_)]
        assert set(got.ravel().tolist()) <= set(kept.tolist())
        assert (got >= 0).all()  # never short while K documents match
    assert by_position.filter_plans == by_id.filter_plans  # the same plans chose the same paths
    assert by_position.filter_plans["index"] > 0
    assert bool(listed_calls) == factory.startswith("IVF")


def test_flat_by_storage_position_is_the_exact_filtered_top_k(built):
    documents, vectors, topic, dirs = built
    shard = load(dirs["Flat"])
    queries = vectors[:5] + 0.02
    for data in FILTERS:
        filter_ = parse_filter(data)
        mask = shard.payload.mask(filter_)
        kept_ids = shard.payload.int_ids[mask]
        _, got = shard.search_ids(queries, K, filter_=filter_)
        by_int = {int(i): n for n, i in enumerate(int_ids(shard, [d.doc_id for d in documents]))}
        rows = np.asarray([by_int[int(i)] for i in kept_ids])
        for query, row in zip(queries, got, strict=True):
            scores = vectors[rows] @ query
            best = kept_ids[np.argsort(-scores, kind="stable")[:K]]
            assert set(row.tolist()) == set(best.tolist())


def test_ivf_counts_each_list_by_payload_position_as_by_id(built):
    documents, vectors, topic, dirs = built
    shard = load(dirs["IVF16,Flat"])
    frame = shard.filtered.frame(shard.payload.int_ids, shard.bare)
    assert frame.list_of_payload is not None and (frame.list_of_payload >= 0).all()
    exclude = shard.payload.int_ids[::7]
    queries = vectors[:6] + 0.01
    for data in FILTERS:
        mask = shard.payload.mask(parse_filter(data))
        selection = Selection.of(mask, frame, exclude)
        by_ids = Selection.of_ids(selection.allowed)  # the same documents, no frame behind them
        assert selection.matches == by_ids.matches == int(mask.sum()) - int(mask[::7].sum())
        assert np.array_equal(shard.filtered._ivf_breadths(queries, selection),
                              shard.filtered._ivf_breadths(queries, by_ids))
        lists_of, _ = shard.filtered._list_layout()
        assert np.array_equal(selection.per_list(16), np.bincount(lists_of(selection.allowed), minlength=16))


def test_a_selection_leaves_out_bare_and_excluded_documents():
    payload_ids = np.asarray([50, 10, 40, 20, 30], dtype=np.int64)
    frame = PayloadFrame.build(payload_ids, bare=np.asarray([40], dtype=np.int64))
    frame.attach_storage(np.asarray([10, 20, 30, 50, 40], dtype=np.int64))
    mask = np.asarray([True, True, True, False, True])
    selection = Selection.of(mask, frame, exclude=np.asarray([30, 99], dtype=np.int64))
    assert selection.allowed.tolist() == [50, 10] and selection.matches == 2
    assert selection.storage_mask().tolist() == [True, False, False, True, False]
    assert selection.rejected() is None  # 2 of 5 kept: the kept ids are the smaller set
    assert Selection.of(np.ones(5, bool), frame).rejected().tolist() == [40]
    with pytest.raises(Exception, match="77"):
        frame.attach_storage(np.asarray([10, 77], dtype=np.int64))
    assert mask.tolist() == [True, True, True, False, True]  # the payload's mask is not changed


def test_the_ids_of_some_ivf_lists_are_the_kept_ones_or_the_fewer_rejected_ones(built):
    """The selector of an IVF call holds what the lists it scans keep — or, where fewer, what they
    reject (negated) — read from a few lists' slices or, for many, one pass over every document."""
    *_, dirs = built
    shard = load(dirs["IVF16,Flat"])
    frame = shard.filtered.frame(shard.payload.int_ids, shard.bare)
    rng = np.random.default_rng(9)
    seen = set()
    for data in FILTERS:
        selection = Selection.of(shard.payload.mask(parse_filter(data)), frame, shard.payload.int_ids[::5])
        for size in (1, 2, 3, 8, 16):
            lists = np.sort(rng.choice(16, size, replace=False))
            ids, negated = selection.ids_in_lists(lists)
            inside = np.isin(frame.list_of_payload, lists)
            want = selection.payload_ids[inside & (selection.kept != negated)]
            assert sorted(ids.tolist()) == sorted(want.tolist()), (data, size)
            assert len(ids) <= int(inside.sum()) // 2 + 1
            seen.add((negated, size * 8 < 17))
    assert seen == {(False, True), (False, False), (True, True), (True, False)}  # every branch ran


def test_an_ivf_scans_no_list_the_filter_empties_and_whole_lists_need_no_selector(built, monkeypatch):
    """A list holding no kept document is not handed to FAISS (its entries would all be read and
    rejected), nor the lists past those that held twice the kept documents a row needs; where
    every scanned list holds only kept documents there is no selector at all; else the selector
    holds the scanned lists' kept (or rejected) ids."""
    documents, vectors, topic, dirs = built
    shard = load(dirs["IVF16,Flat"])
    frame = shard.filtered.frame(shard.payload.int_ids, shard.bare)
    ivf = shard.filtered._ivf
    _, every = ivf.quantizer.search(vectors[:8] + 0.01, 16)  # every list, nearest first

    def never():
        raise AssertionError("the whole kept set's selector was not needed")

    # keep exactly the documents of lists 0–5: whole lists
    whole = np.isin(frame.list_of_payload, np.arange(6))
    lists, selector = shard.filtered._ivf_scan(every, Selection.of(whole, frame), never, 16)
    assert selector is None
    assert set(lists[lists >= 0].tolist()) == set(range(6))
    assert ((lists >= 0).sum(axis=1) == 6).all()  # each query scans the 6, in its own order
    assert np.array_equal(lists[lists >= 0], every[np.isin(every, np.arange(6))])
    # one rejected document in list 2: a selector of the few rejected, over the same lists
    member = int(frame.list_members[frame.list_offsets[2]])
    some = whole.copy()
    some[member] = False
    lists, selector = shard.filtered._ivf_scan(every, Selection.of(some, frame), never, 16)
    assert set(lists[lists >= 0].tolist()) == set(range(6))
    assert selector is not None and not selector.is_member(int(frame.payload_ids[member]))
    assert selector.is_member(int(frame.payload_ids[frame.list_members[frame.list_offsets[3]]]))
    # the same filter with tombstones emptying list 0: list 0 goes too
    gone = frame.payload_ids[frame.list_members[frame.list_offsets[0]:frame.list_offsets[1]]]
    lists, _ = shard.filtered._ivf_scan(every, Selection.of(some, frame, gone), never, 16)
    assert set(lists[lists >= 0].tolist()) == set(range(1, 6))
    # a row needs what its nearest `base` lists hold: its scan stops after the list where the kept
    # documents seen reach SCAN_SLACK times that (here 2 × one list, of a filter keeping lists 0–5)
    monkeypatch.setattr(filtered, "SCAN_SLACK", 2)
    _, sizes = shard.filtered._list_layout()
    per_list = Selection.of(whole, frame).per_list(16)
    lists, _ = shard.filtered._ivf_scan(every, Selection.of(whole, frame), never, 1)
    for row, scanned in zip(every, lists, strict=True):
        kept_lists = row[np.isin(row, np.arange(6))]
        seen = np.cumsum(per_list[kept_lists])
        stop = int(np.searchsorted(seen, 2 * sizes[row[0]])) + 1  # the list reaching it is scanned
        assert scanned[scanned >= 0].tolist() == kept_lists[:stop].tolist()
    assert (lists >= 0).sum() < (every >= 0).sum() * 6 / 16  # some row stopped early
    # and the answers, the lists left out being empty ones alone: equal to the id selector's
    monkeypatch.setattr(filtered, "SCAN_SLACK", 10**9)
    by_id = load(dirs["IVF16,Flat"], positional=False)
    queries = vectors[:8] + 0.01
    filter_ = parse_filter({"must": [{"key": "topic", "match": {"any": [1, 4]}}]})
    for knobs in ({"nprobe": 1}, {"nprobe": 4}, {"nprobe": 16}):
        got_scores, got = shard.search_ids(queries, K, filter_=filter_, exclude=gone, **knobs)
        want_scores, want = by_id.search_ids(queries, K, filter_=filter_, exclude=gone, **knobs)
        assert np.array_equal(got, want) and np.array_equal(got_scores, want_scores)


def test_per_list_counts_skip_empty_lists_and_documents_outside_the_ivf(monkeypatch):
    """(A segmented sum reads an empty segment as one element: lists 1 and 3 hold nothing here,
    list 5 is past the last non-empty one, and id 60 is in no list.)"""
    payload_ids = np.asarray([50, 10, 40, 20, 30, 60], dtype=np.int64)
    frame = PayloadFrame.build(payload_ids, bare=np.zeros(0, dtype=np.int64))
    stored = np.asarray([10, 20, 30, 40, 50], dtype=np.int64)
    frame.attach_lists(stored, np.asarray([0, 2, 2, 4, 0], dtype=np.int64))
    masks = ([True] * 6, [True, False, True, True, False, True], [False] * 6, [False, True, False, False, True, True])
    for share in (1, 10**6):  # both ways of counting: the kept documents' lists, every flag by list
        monkeypatch.setattr(selection_module, "PER_LIST_GATHER_SHARE", share)
        for mask in masks:
            selection = Selection.of(np.asarray(mask), frame)
            kept_lists = frame.list_of_payload[np.asarray(mask) & (frame.list_of_payload >= 0)]
            assert selection.per_list(6).tolist() == np.bincount(kept_lists, minlength=6).tolist(), (share, mask)
