"""`shardrag tune`: the chosen knob meets its recall target on queries it never saw, is written to
the version's search.json, and is what replicas search with when a query sets nothing."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.search_defaults import SEARCH_DEFAULTS_FILE, read_search_defaults
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from retrieval.errors import ConfigError, IndexIntegrityError, InvalidRequest, NotFound
from serving.cli import build_parser
from tests.conftest import REPORT, random_corpus

pytestmark = pytest.mark.slow  # spawns worker processes


def _tune(root, *extra: str) -> int:
    args = build_parser().parse_args(["tune", "--collection", "c", "--root", str(root), "--workers", "2", *extra])
    return int(args.func(args))


def _sharded_recall(directory, num_shards: int, queries: np.ndarray, truth: list[list[str]],
                    override: dict[str, int] | None = None, k: int = 10) -> float:
    """recall@k of the sharded search as replicas run it: no knob in the query, so the version's
    defaults apply (or ``override``, set as the defaults)."""
    shards = [Shard.load(shard_dir(directory, i), device="cpu") for i in range(num_shards)]
    for shard in shards:
        if override:
            shard.index.set_defaults(override)
    hits = []
    for row in range(len(queries)):
        merged = []
        for shard in shards:
            found = shard.search(queries[row:row + 1], k, with_text=False)[0]
            merged += zip(found["scores"], found["doc_ids"], strict=True)
        hits.append({doc for _, doc in sorted(merged, key=lambda pair: -pair[0])[:k]})
    return float(np.mean([len(hits[row] & set(truth[row])) / k for row in range(len(queries))]))


def _real_corpus(tmp_path, msmarco, dbpedia, seed: int):
    """The 10k real MiniLM vectors and 100 real queries: half the query texts written to
    tune.txt for tuning, the other half's rows returned as held out."""
    documents = msmarco.documents + dbpedia.documents
    vectors = np.concatenate([msmarco.vectors, dbpedia.vectors])
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids] + \
        [dbpedia.dataset.queries[q] for q in dbpedia.query_ids]
    query_vectors = np.concatenate([msmarco.query_vectors, dbpedia.query_vectors])
    order = np.random.default_rng(seed).permutation(len(texts))
    (tmp_path / "tune.txt").write_text("\n".join(texts[i] for i in order[:50]))
    return documents, vectors, query_vectors, order[50:]


@pytest.fixture
def single_threaded_faiss():
    """HNSW builds are only deterministic on one thread: the test must not depend on scheduling."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.mark.parametrize("factory,knob", [("IVF64,Flat", "nprobe"), ("HNSW16", "ef_search")])
def test_tuned_knob_meets_target_on_held_out_real_queries(tmp_path, msmarco, dbpedia, capsys, single_threaded_faiss,
                                                          factory, knob):
    documents, vectors, query_vectors, held_out = _real_corpus(tmp_path, msmarco, dbpedia, seed=7)
    build_collection(tmp_path, documents, vectors, msmarco.version, BuildConfig("c", 2, "hash", factory),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    target = 0.95

    assert _tune(tmp_path, "--recall", str(target), "--queries", str(tmp_path / "tune.txt"),
                 "--json", str(tmp_path / "r.json")) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    chosen = report["chosen"]
    assert report["knob"] == knob and chosen["recall_low"] >= target
    assert any(c["pareto"] for c in report["candidates"]) and "<- chosen" in capsys.readouterr().out
    tuned = read_search_defaults(directory)
    assert tuned is not None and tuned.params == {knob: chosen["value"]} and tuned.recall_target == target

    # The 50 queries it never saw, searched as replicas search them (no knob: search.json applies)
    ids = [doc.doc_id for doc in documents]
    exact = np.argsort(-(query_vectors[held_out] @ vectors.T), axis=1)[:, :10]
    truth = [[ids[i] for i in row] for row in exact]
    recall = _sharded_recall(directory, 2, query_vectors[held_out], truth)
    REPORT.append(f"tune {factory}: {knob}={chosen['value']} (tuning recall {chosen['recall']:.3f}, 95 % low "
                  f"{chosen['recall_low']:.3f}); held-out real queries recall@10 {recall:.3f} (target {target})")
    assert recall >= target, f"{knob}={chosen['value']}: recall@10 {recall:.3f} on the held-out queries"
    cheapest = report["candidates"][0]["value"]
    assert _sharded_recall(directory, 2, query_vectors[held_out], truth, {knob: cheapest}) < recall


def test_unreachable_target_writes_nothing_and_flat_has_nothing_to_tune(tmp_path, capsys):
    documents, vectors, version = random_corpus(n=3000, dim=32)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 2, "hash", "IVF64,Flat"),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    # one list of 64 on random vectors finds well under half of the true top 10
    assert _tune(tmp_path, "--recall", "0.9", "--sample", "60", "--max-value", "1") == 1
    assert not (directory / SEARCH_DEFAULTS_FILE).exists()
    assert "Nothing written" in capsys.readouterr().err

    flat_root = tmp_path / "flat"
    build_collection(flat_root, documents, vectors, version, BuildConfig("c", 2, "hash", "Flat"), show_progress=False)
    assert _tune(flat_root, "--sample", "20") == 0
    assert "nothing to tune" in capsys.readouterr().out
    assert read_search_defaults(resolve_version(flat_root, "c")[0]) is None


def test_bad_arguments_fail_fast_naming_the_flag(tmp_path):
    documents, vectors, version = random_corpus(n=500, dim=16)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 1, "hash", "IVF8,Flat"),
                     show_progress=False)
    bad = ((["--recall", "1.5"], "recall"), (["--k", "0"], "k"), (["--sample", "3"], "sample"),
           (["--queries", str(tmp_path / "missing.txt")], "queries"), (["--max-value", "0"], "max_value"),
           (["--ef-construction", "100"], "ef_construction"))  # build breadths without --rebuild: nothing to build
    for flags, field in bad:
        with pytest.raises(InvalidRequest) as caught:
            _tune(tmp_path, *flags)
        assert caught.value.field == field
    for breadths in ("2", "40,x", ","):  # out of the build's range, not integers, none: refused while parsing
        with pytest.raises(SystemExit):
            _tune(tmp_path, "--rebuild", "--ef-construction", breadths)
    with pytest.raises(NotFound):
        _tune(tmp_path / "elsewhere")
    assert read_search_defaults(resolve_version(tmp_path, "c")[0]) is None


def test_query_knob_never_leaks_into_the_next_query_and_info_shows_defaults(tmp_path):
    documents, vectors, version = random_corpus(n=2000, dim=32)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 1, "hash", "IVF32,Flat"),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    (directory / SEARCH_DEFAULTS_FILE).write_text(json.dumps({"nprobe": 32}))
    shard = Shard.load(shard_dir(directory, 0), device="cpu")
    query = vectors[:20]
    exhaustive = [shard.search(query, 10, with_text=False)[i]["doc_ids"] for i in range(20)]
    exact = np.argsort(-(query @ vectors.T), axis=1)[:, :10]
    assert exhaustive == [[documents[i].doc_id for i in row] for row in exact]  # nprobe 32 of 32: exact
    narrow = shard.search(query, 10, nprobe=1, with_text=False)
    assert [r["doc_ids"] for r in narrow] != exhaustive  # the query's own nprobe applies to it ...
    again = shard.search(query, 10, with_text=False)
    assert [r["doc_ids"] for r in again] == exhaustive  # ... and not to the next query

    versions = ShardVersions(shard)
    assert versions.describe()[0].search_defaults == {"nprobe": 32}

    (directory / SEARCH_DEFAULTS_FILE).write_text(json.dumps({"ef_search": 64}))  # not a knob of IVF
    with pytest.raises(IndexIntegrityError, match="ef_search"):
        Shard.load(shard_dir(directory, 0), device="cpu")
    (directory / SEARCH_DEFAULTS_FILE).write_text("{not json")
    with pytest.raises(IndexIntegrityError, match="malformed"):
        Shard.load(shard_dir(directory, 0), device="cpu")


@pytest.mark.alone  # tests/sharing.py: a Ray cluster (one per machine)
def test_ray_backend_chooses_what_local_workers_choose(tmp_path):
    pytest.importorskip("ray")
    documents, vectors, version = random_corpus(n=3000, dim=32)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 2, "hash", "IVF64,Flat"),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    assert _tune(tmp_path, "--recall", "0.9", "--sample", "200", "--dry-run",
                 "--json", str(tmp_path / "local.json")) == 0
    import ray

    try:
        assert _tune(tmp_path, "--recall", "0.9", "--sample", "200", "--backend", "ray",
                     "--json", str(tmp_path / "ray.json")) == 0
    finally:
        ray.shutdown()
    local, remote = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("local", "ray"))
    # recall does not depend on where a shard was evaluated; only the timings do
    assert [c["recall"] for c in remote["candidates"]] == [c["recall"] for c in local["candidates"]]
    assert remote["chosen"]["value"] == local["chosen"]["value"]
    assert read_search_defaults(directory).params == {"nprobe": local["chosen"]["value"]}


@pytest.mark.alone  # tests/sharing.py: it compares measured QPS
def test_rebuild_finds_a_cheaper_structure_for_flat_that_holds_on_held_out_queries(tmp_path, msmarco, dbpedia,
                                                                                  capsys, single_threaded_faiss):
    documents, vectors, query_vectors, held_out = _real_corpus(tmp_path, msmarco, dbpedia, seed=11)
    build_collection(tmp_path, documents, vectors, msmarco.version, BuildConfig("c", 2, "hash", "Flat"),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    target = 0.95

    assert _tune(tmp_path, "--recall", str(target), "--queries", str(tmp_path / "tune.txt"), "--rebuild",
                 "--json", str(tmp_path / "r.json")) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    structures = {s["label"]: s for s in report["structures"]}
    assert report["structures"][0]["label"] == "Flat" and structures["Flat"]["chosen"]["recall"] == 1.0
    # every HNSW candidate is tried as FAISS links it (40) and wider (100)
    assert {"HNSW16", "HNSW16 efC100", "HNSW32", "HNSW32 efC100"} <= set(structures)
    breadth = report["chosen_ef_construction"]
    chosen = next(s for s in report["structures"] if (s["factory"], s["ef_construction"]) == (report["chosen"],
                                                                                               breadth))
    assert report["chosen"] != "Flat" and chosen["chosen"]["recall_low"] >= target
    assert chosen["chosen"]["qps"] > structures["Flat"]["chosen"]["qps"]  # why it was chosen: it is cheaper
    if breadth is not None:  # a wider graph won only by needing a smaller knob value than the narrower one
        narrower = structures[report["chosen"]]["chosen"]
        assert narrower is None or narrower["value"] > chosen["chosen"]["value"]
    out = capsys.readouterr().out
    flag = f" --ef-construction {breadth}" if breadth is not None else ""
    assert f"--factory '{report['chosen']}'{flag} --overwrite" in out and "Nothing written" in out
    assert read_search_defaults(directory) is None  # the published Flat version is left as it is

    # Build what it recommends, with the knob it chose, and search the 50 queries it never saw
    rebuilt = tmp_path / "rebuilt"
    build_collection(rebuilt, documents, vectors, msmarco.version,
                     BuildConfig("c", 2, "hash", report["chosen"], ef_construction=breadth), show_progress=False)
    ids = [doc.doc_id for doc in documents]
    exact = np.argsort(-(query_vectors[held_out] @ vectors.T), axis=1)[:, :10]
    truth = [[ids[i] for i in row] for row in exact]
    recall = _sharded_recall(resolve_version(rebuilt, "c")[0], 2, query_vectors[held_out], truth,
                             {chosen["knob"]: chosen["chosen"]["value"]})
    REPORT.append(f"tune --rebuild Flat: {chosen['label']} with {chosen['knob']}={chosen['chosen']['value']} "
                  f"({chosen['chosen']['qps']:.0f} vs Flat {structures['Flat']['chosen']['qps']:.0f} QPS); held-out "
                  f"real queries recall@10 {recall:.3f} (target {target})")
    assert recall >= target


def test_rebuild_refuses_compressed_codes_before_any_work(tmp_path):
    documents, vectors, version = random_corpus(n=1000, dim=16)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 1, "hash", "IVF4,SQ8"),
                     show_progress=False)
    with pytest.raises(ConfigError) as caught:
        _tune(tmp_path, "--rebuild", "--sample", "20")
    assert caught.value.field == "rebuild"
    assert read_search_defaults(resolve_version(tmp_path, "c")[0]) is None


def test_rebuild_keeps_an_exact_index_when_nothing_approximate_meets_the_target(tmp_path, capsys):
    # --max-value 1: HNSW has no ef_search that low and IVF probes one list, far below recall 0.99
    documents, vectors, version = random_corpus(n=2000, dim=16)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 2, "hash", "Flat"), show_progress=False)
    assert _tune(tmp_path, "--rebuild", "--recall", "0.99", "--max-value", "1", "--sample", "40",
                 "--json", str(tmp_path / "r.json")) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["chosen"] == "Flat" and len(report["structures"]) > 1
    out = capsys.readouterr().out
    assert "the published Flat, exact" in out and "(over --max-value)" in out
    assert read_search_defaults(resolve_version(tmp_path, "c")[0]) is None
