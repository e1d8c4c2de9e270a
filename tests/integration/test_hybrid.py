"""Lexical and hybrid search through the REST API of a sharded cluster (real shard processes):
the lexical ranking equals an unsharded BM25 index's on every query — before writes, after
upserts and deletes through the API, and after each shard compacted; hybrid fuses both legs
and says where each leg ranked each hit; a filter holds on both legs; bad input is a 4xx
naming the field. nDCG@10 of every mode is reported (the acceptance table and the choice of
weights: benchmarks/hybrid_quality.py)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from index_shards import compaction
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.writes import accept
from retrieval.analysis import query_terms
from retrieval.bm25 import LexicalQuery
from retrieval.contract import SearchParams
from retrieval.ir_metrics import ndcg_at_k
from retrieval.records import DELETE, UPSERT, WalRecord
from retrieval.search_quality import best_weight
from retrieval.types import EmbeddingVersion
from serving.local.launcher import LocalCluster
from tests.conftest import REPORT, data_dir
from tests.helpers.metrics import lexical_rounds

pytestmark = pytest.mark.slow
SHARDS = 3
K = 10


class Unsharded:
    """The reference: every document in one shard, BM25 under its own statistics."""

    def __init__(self, root, documents) -> None:
        vectors = np.zeros((len(documents), 8), dtype=np.float32)  # the lexical leg never reads them
        build_collection(root, documents, vectors, EmbeddingVersion("ref", "0" * 64, 8),
                         BuildConfig("ref", 1), show_progress=False)
        directory, _ = resolve_version(root, "ref")
        self.replica = ShardVersions(Shard.load(shard_dir(directory, 0), device="cpu"), data_dir=root / "data")
        self.version = self.replica.ready_ids()[0]

    def search(self, text: str, k: int = K) -> list[tuple[str, float]]:
        hits = self.replica.search(np.zeros((0, 8)), SearchParams(k, None, lexical=True),
                                   [LexicalQuery(text)]).results[0]
        return list(zip(hits["doc_ids"], hits["scores"], strict=True))

    def write(self, op: int, doc_id: str, title: str = "", text: str = "", metadata=None) -> None:
        seq = self.replica.get(self.version).applied_seq + 1
        accept(self.replica, self.version, 0, None, [WalRecord(seq, op, doc_id, title, text, metadata or {},
                                                               np.zeros(8, np.float32) if op == UPSERT else None)])


def launch(request, tmp_path_factory):
    corpus = request.getfixturevalue(request.param)
    root = tmp_path_factory.mktemp("root")
    build_collection(root, corpus.documents, corpus.vectors, corpus.version, BuildConfig(request.param, SHARDS),
                     show_progress=False)
    reference = Unsharded(tmp_path_factory.mktemp("reference"), corpus.documents)
    with LocalCluster(root, request.param, replicas=1, workdir=tmp_path_factory.mktemp("work")) as cluster:
        with httpx.Client(base_url=cluster.gateway_url, timeout=120) as http:
            yield corpus, cluster, http, reference


@pytest.fixture(scope="module", params=["msmarco", "dbpedia"])
def setup(request, tmp_path_factory):
    """A cluster of the corpus as built: no test writes to it."""
    yield from launch(request, tmp_path_factory)


@pytest.fixture(params=["msmarco", "dbpedia"])
def written(request, tmp_path_factory):
    """A cluster of its own, for the test that writes and compacts."""
    yield from launch(request, tmp_path_factory)


def query(http: httpx.Client, text: str, **extra) -> dict:
    reply = http.post("/v1/query", json={"text": text, "k": K, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def lexical(http: httpx.Client, text: str, **extra) -> list[tuple[str, float]]:
    return [(h["doc_id"], h["score"]) for h in query(http, text, mode="lexical", **extra)["hits"]]


def test_lexical_ranking_equals_unsharded_bm25_through_writes_and_compaction(written):
    corpus, cluster, http, reference = written
    texts = [corpus.dataset.queries[q] for q in sorted(corpus.dataset.queries)]

    def all_equal(stage: str) -> None:
        for text in texts:
            assert lexical(http, text) == reference.search(text), f"{stage}: {text}"  # ids, order, score bits

    all_equal("as built")
    rng = np.random.default_rng(11)
    documents = corpus.documents
    upserts, deleted = [], []
    for i in range(40):  # new documents, and existing ones rewritten, through the API (the gateway embeds)
        donor = documents[int(rng.integers(len(documents)))]
        doc_id = f"written-{i}" if i % 2 else documents[int(rng.integers(len(documents)))].doc_id
        text = f"{donor.text} {texts[i % len(texts)]}"
        upserts.append({"id": doc_id, "title": donor.title, "text": text, "metadata": {"written": True}})
    for start in range(0, len(upserts), 20):
        reply = http.post("/v1/documents", json={"documents": upserts[start:start + 20], "write_ack": "all"})
        assert reply.status_code == 200, reply.text
    for doc in upserts:
        reference.write(UPSERT, doc["id"], doc["title"], doc["text"], doc["metadata"])
    deleted = sorted({documents[int(i)].doc_id for i in rng.integers(len(documents), size=30)} -
                     {doc["id"] for doc in upserts})
    reply = http.post("/v1/documents/delete", json={"ids": deleted, "write_ack": "all"})
    assert reply.status_code == 200, reply.text
    for doc_id in deleted:
        reference.write(DELETE, doc_id)
    all_equal("after upserts and deletes")

    only_written = {"must": [{"key": "written", "match": {"value": True}}]}
    for text in texts[:10]:  # a filter holds on the lexical leg and on the fused list
        assert all(doc_id in {d["id"] for d in upserts} for doc_id, _ in lexical(http, text, filter=only_written))
        fused = query(http, text, mode="hybrid", filter=only_written, with_metadata=True)["hits"]
        assert fused and all(hit["metadata"] == {"written": True} for hit in fused)

    for urls in cluster.shard_urls:
        for url in urls:
            done = httpx.post(f"{url}/admin/compact", timeout=120)
            assert done.status_code == 200 and done.json()["compacted"] > 0, done.text
    compaction.compact(reference.replica, reference.version)
    all_equal("after compaction")

    # kill -9 every replica: each comes back (the supervisor restarts it) having remembered that it
    # serves lexical queries, and builds its lexical index before any lexical query asks for it
    pids = [child.process.pid for group in cluster.shards for child in group if child.process is not None]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 90
    for urls in cluster.shard_urls:
        for url in urls:
            while True:
                try:
                    versions = httpx.get(f"{url}/admin/versions", timeout=5).json()["versions"]
                except (httpx.HTTPError, ValueError):
                    versions = []
                if versions and all(v.get("lexical_index") == "built" for v in versions):
                    break
                assert time.monotonic() < deadline, f"{url} did not come back with its lexical index: {versions}"
                time.sleep(0.2)
    assert all(child.process is not None and child.process.pid not in pids for group in cluster.shards
               for child in group)  # every replica answering is a restarted process
    all_equal("after every replica restarted")


def counted(http: httpx.Client, mode: str) -> tuple[float, float]:
    """From the gateway's metrics: the queries it has sent to shards, summed over its calls (the
    batch-size histogram, where every mode's calls are recorded), and the queries of ``mode``
    answered (the query latency histogram's label)."""
    metrics = http.get("/metrics").text
    sent = re.search(r"^shardrag_gateway_shard_batch_size_queries_sum (\S+)$", metrics, re.MULTILINE)
    answered = re.search(rf'^shardrag_gateway_query_latency_seconds_count{{mode="{mode}"}} (\S+)$', metrics,
                         re.MULTILINE)
    return float(sent[1]) if sent else 0.0, float(answered[1]) if answered else 0.0


def test_modes_fuse_both_legs_and_report_each_legs_rank(setup):
    corpus, _, http, _ = setup
    queries = corpus.dataset.judged_queries()
    scores = {}
    asked = {word for text in queries.values() for word in text.lower().split()}
    words = sorted({word for doc in corpus.documents[:400] for word in doc.text.lower().split()
                    if word.isalpha() and len(word) > 6} - asked)
    unseen = {query_id: words[i % len(words)] for i, query_id in enumerate(queries)}
    for label, extra in {"dense": {}, "lexical": {"mode": "lexical"}, "rrf": {"mode": "hybrid", "fusion": "rrf"},
                         "weighted": {"mode": "hybrid"}}.items():
        rankings = {}
        metric_mode = {"rrf": "hybrid_rrf", "weighted": "hybrid_weighted"}.get(label, label)
        sent, answered = counted(http, metric_mode)
        rounds = lexical_rounds(http)
        for query_id, text in queries.items():
            answer = query(http, text, **extra)
            rankings[query_id] = [hit["doc_id"] for hit in answer["hits"]]
            assert answer["diagnostics"]["mode"] == extra.get("mode", "dense")
            # the terms the lexical leg searched (analysed as the shards do); none for a dense query
            assert answer["diagnostics"]["lexical_terms"] == (
                None if label == "dense" else [term for term, _ in query_terms(text)])
            if label == "rrf":  # the fused score is Σ 1/(60 + rank) over the legs each hit shows
                for hit in answer["hits"]:
                    assert hit["legs"] and all(1 <= where["rank"] <= 20 for where in hit["legs"].values())
                    assert hit["score"] == pytest.approx(sum(1 / (60 + w["rank"]) for w in hit["legs"].values()))
                legs = {call["leg"] for call in answer["diagnostics"]["per_shard"]}
                assert legs == {"dense", "lexical"} and answer["diagnostics"]["fusion"].startswith("rrf k=60")
                # top_m sends the legs separately (the dense one trimmed, exactly): the same fused answer
                apart = query(http, text, top_m=SHARDS, **extra)
                assert [(h["doc_id"], h["score"], h["legs"]) for h in apart["hits"]] == \
                    [(h["doc_id"], h["score"], h["legs"]) for h in answer["hits"]]
            if label == "weighted":  # one fused call per shard; each hit's legs scored, ranked where known
                assert {call["leg"] for call in answer["diagnostics"]["per_shard"]} == {"hybrid"}
                assert answer["diagnostics"]["fusion"].startswith("weighted dense=0.8 lexical=0.2")
                fused = [hit["score"] for hit in answer["hits"]]
                assert fused == sorted(fused, reverse=True) and all(0 < f <= 1 for f in fused)
                for hit in answer["hits"]:
                    dense = hit["legs"]["dense"]  # every document here has a vector
                    assert dense["rank"] is None or dense["rank"] >= 1
                    assert hit["score"] >= 0.8 * (dense["score"] + 1) / 2 - 1e-9  # BM25's share is ≥ 0
                    if "lexical" in hit["legs"]:
                        assert hit["legs"]["lexical"]["score"] > 0
                # known ranks order the hits as their leg's scores do (equal scores share a rank)
                for leg in ("dense", "lexical"):
                    known = sorted((-hit["legs"][leg]["score"], hit["legs"][leg]["rank"]) for hit in answer["hits"]
                                   if leg in hit["legs"] and hit["legs"][leg]["rank"] is not None)
                    for (score_a, rank_a), (score_b, rank_b) in zip(known, known[1:]):
                        assert rank_a == rank_b if score_a == score_b else rank_a < rank_b
                # a text never seen is embedded (its statistics fetched meanwhile), then its embedding
                # is cached and the query goes in one call: the same answer both ways
                # (its last word, from a document, is one the gateway's statistics have not seen: sent as
                # held by no document, the shards say otherwise and it is asked again under their sum)
                fresh = query(http, f"{text} {unseen[query_id]}", **extra)
                again = query(http, f"{text} {unseen[query_id]}", **extra)
                assert fresh["diagnostics"]["encode_ms"] > 0 and again["diagnostics"]["encode_ms"] == 0
                assert [(h["doc_id"], h["score"], h["legs"]) for h in again["hits"]] == \
                    [(h["doc_id"], h["score"], h["legs"]) for h in fresh["hits"]]
        # every query reached every shard, and each of those calls shows in the gateway's metrics, as
        # does each query's latency under its mode (its fresh and cached repeats too)
        sent_after, answered_after = counted(http, metric_mode)
        assert sent_after - sent >= len(queries) * SHARDS, label
        assert answered_after - answered >= len(queries), label
        # every lexical and hybrid query is counted by its rounds (the first to meet a term takes two:
        # the gateway had not seen it), and the weighted fresh texts' unseen words take two
        one, two = (after - before for after, before in zip(lexical_rounds(http), rounds, strict=True))
        if label == "dense":
            assert (one, two) == (0, 0)
        else:
            assert one + two >= len(queries), label
            assert label != "weighted" or (one >= len(queries) and two >= 1)
        scores[label] = ndcg_at_k(rankings, corpus.dataset.qrels, 10)
    REPORT.append(f"nDCG@10 through REST ({corpus.dataset.name}, {SHARDS} shards): " +
                  ", ".join(f"{label} {value:.4f}" for label, value in scores.items()))
    assert min(scores["rrf"], scores["weighted"]) > scores["lexical"]  # fusion beats the weaker leg everywhere


def test_bad_mode_input_is_refused_naming_the_field(setup):
    _, _, http, _ = setup
    cases = [
        ({"mode": "lexical", "vector": [0.0] * 384}, "vector"),
        ({"mode": "hybrid"}, "text"),
        ({"mode": "lexical", "text": "x", "top_m": 1}, "top_m"),
        ({"mode": "sparse", "text": "x"}, "mode"),
        ({"mode": "hybrid", "text": "x", "fusion": "max"}, "fusion"),
        ({"mode": "hybrid", "text": "x", "fusion": "weighted", "weights": {"dense": -1}}, "weights.dense"),
        ({"mode": "hybrid", "text": "x", "weights": {"dense": 0, "lexical": 0}}, "weights"),  # all scores 0
        ({"mode": "hybrid", "text": "x", "top_m": 1}, "top_m"),
        ({"mode": "hybrid", "text": "x", "rrf_k": -1}, "rrf_k"),
        ({"mode": "hybrid", "text": "x", "candidates": 0}, "candidates"),
        # fields of a fusion that would be ignored: refused, not silently dropped
        ({"text": "x", "fusion": "rrf"}, "fusion"),  # no mode: a dense query its sender thinks hybrid
        ({"mode": "lexical", "text": "x", "candidates": 50}, "candidates"),
        ({"mode": "hybrid", "text": "x", "fusion": "rrf", "weights": {"dense": 1}}, "weights"),
        ({"mode": "hybrid", "text": "x", "fusion": "weighted", "rrf_k": 30}, "rrf_k"),
    ]
    for body, field in cases:
        reply = http.post("/v1/query", json=body)
        assert 400 <= reply.status_code < 500, (body, reply.text)
        assert reply.json()["error"]["field"] == field, (body, reply.text)


def test_eval_through_the_gateway_reports_each_mode_and_weight(setup):
    """``shardrag eval --url``: the judged queries through the running gateway, one row per mode and
    dense weight, the figures those queries give when sent here; the best weight named."""
    corpus, cluster, http, _ = setup
    name, queries = corpus.dataset.name, corpus.dataset.judged_queries()
    command = [sys.executable, "-m", "serving", "eval", "--url", cluster.gateway_url, "--collection", name,
               "--dataset", str(data_dir() / name)]
    done = subprocess.run(command + ["--weights", "0.8,1", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {row["setting"]: row for row in json.loads(done.stdout)}
    assert list(rows) == ["dense", "lexical", "hybrid rrf", "hybrid weighted", "weighted w=0.8", "weighted w=1"]
    for label, extra in {"dense": {}, "lexical": {"mode": "lexical"}, "hybrid rrf": {"mode": "hybrid", "fusion": "rrf"},
                         "weighted w=0.8": {"mode": "hybrid", "weights": {"dense": 0.8, "lexical": 0.2}}}.items():
        rankings = {query_id: [hit["doc_id"] for hit in query(http, text, **extra)["hits"]]
                    for query_id, text in queries.items()}
        assert rows[label]["ndcg@10"] == ndcg_at_k(rankings, corpus.dataset.qrels, 10), label
        assert (rows[label]["queries"], rows[label]["k"]) == (len(queries), K)
        assert 0 < rows[label]["recall@10"] <= 1 and 0 < rows[label]["mrr@10"] <= 1
    # the gateway's default weights are 0.8 / 0.2; a lexical weight of 0 leaves the dense ranking
    assert rows["hybrid weighted"]["ndcg@10"] == rows["weighted w=0.8"]["ndcg@10"]
    assert rows["weighted w=1"]["ndcg@10"] == pytest.approx(rows["dense"]["ndcg@10"], abs=1e-9)
    # without --url the same command searches the index files in process: the dense figures agree
    on_disk = subprocess.run([sys.executable, "-m", "serving", "eval", "--collection", name, "--root",
                              str(cluster.root), "--dataset", str(data_dir() / name), "--device", "cpu", "--json"],
                             capture_output=True, text=True, timeout=600)
    assert on_disk.returncode == 0, on_disk.stderr
    (disk,) = json.loads(on_disk.stdout)
    assert disk["ndcg@10"] == pytest.approx(rows["dense"]["ndcg@10"], abs=1e-9)
    assert disk["mrr@10"] == pytest.approx(rows["dense"]["mrr@10"], abs=1e-9) and disk["queries"] == len(queries)

    # the table, at k=20: a weighted hybrid is the exact fused top k, so its top 10 — and nDCG@10 — are
    # the same as at k=10; the best weight is named
    shown = subprocess.run(command + ["--modes", "dense", "--weights", "0.8,1", "--k", "20"], capture_output=True,
                           text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "R@20" in lines[0] and [line.split()[:2] for line in lines[2:4]] == [["weighted", "w=0.8"],
                                                                                 ["weighted", "w=1"]]
    assert [line.split()[2] for line in lines[2:4]] == [f"{rows[label]['ndcg@10']:.4f}"
                                                       for label in ("weighted w=0.8", "weighted w=1")]
    best = best_weight(list(rows.values()))
    assert best is not None
    assert lines[-2].startswith(f"best weighted fusion by nDCG@10: dense {best['dense_weight']:g},"), shown.stdout
    # and how to make the best setting what a query naming none gets: here the gateway config's section,
    # this being the collection the gateway was started with
    top = max((rows[label] for label in ("dense", "weighted w=0.8", "weighted w=1")), key=lambda r: r["ndcg@10"])
    assert lines[-1].startswith('make it the query default: the gateway config\'s "query_defaults": '
                                f'{{"mode": "{top["mode"]}"'), shown.stdout

    for flags, words in ((["--weights", "2"], "between 0 and 1"), (["--modes", "sparse"], "unknown mode"),
                         (["--models", "a,b"], "--models")):
        refused = subprocess.run(command + flags, capture_output=True, text=True, timeout=600)
        assert refused.returncode == 2 and refused.stderr.startswith("error: ") and words in refused.stderr, flags
    # a gateway that is not there (a port held, never listening): one error line, not a traceback
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{held.getsockname()[1]}"
        refused = subprocess.run([*command[:5], gone, *command[6:]], capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and f"error: no answer from POST {gone}/" in refused.stderr
    assert "Traceback" not in refused.stderr
