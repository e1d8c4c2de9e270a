"""`shardrag serve --backend embedded`: every shard in the gateway's one process, as a user runs it —
the collections created at run time too (on a node inside that process)."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from tests.helpers.oracle import ExactOracle, assert_same_ranking

pytestmark = pytest.mark.slow
SHARDRAG = [sys.executable, "-m", "serving"]
NUM_SHARDS = 3


def start(root: Path, workdir: Path, *extra: str) -> tuple[subprocess.Popen[str], str, str, str]:
    """(process, gateway URL, read key, admin key) once the banner is out."""
    serve = subprocess.Popen(SHARDRAG + ["serve", "--backend", "embedded", "--collection", "msmarco", "--root",
                                         str(root), "--port", "0", "--no-encoder", "--workdir", str(workdir), *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, banner = time.monotonic() + 120, ""
    while "Ctrl-C" not in banner:
        line = serve.stdout.readline()
        assert line or serve.poll() is None, serve.stderr.read()
        banner += line
        assert time.monotonic() < deadline, banner
    url = re.search(r"shardrag is up: (http://127\.0\.0\.1:\d+)", banner).group(1)
    assert "loaded in this one process" in banner and "faults set" not in banner
    keys = [re.search(rf"^\s+{scope}\s+(\S+)$", banner, flags=re.M).group(1) for scope in ("read", "admin")]
    return serve, url, keys[0], keys[1]


def stop(serve: subprocess.Popen[str]) -> None:
    serve.send_signal(signal.SIGINT)
    assert serve.wait(60) == 0


def test_one_process_answers_exactly_takes_writes_that_survive_a_restart_and_refuses_faults(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents, msmarco.vectors, msmarco.version,
                     BuildConfig("msmarco", NUM_SHARDS, "kmeans", "Flat"), show_progress=False)
    serve, url, read_key, admin_key = start(root, tmp_path / "work")
    fresh = np.asarray(msmarco.vectors[0] + msmarco.vectors[1], dtype=np.float32)
    fresh /= np.linalg.norm(fresh)
    try:
        children = Path(f"/proc/{serve.pid}/task/{serve.pid}/children").read_text().split()
        assert children == []  # no shard server, no encoder worker: one process
        oracle = ExactOracle([d.doc_id for d in msmarco.documents], msmarco.vectors)
        with httpx.Client(base_url=url, timeout=30, headers={"authorization": f"Bearer {read_key}"}) as http:
            assert http.post("/v1/query", json={"vector": msmarco.query_vectors[0].tolist(), "k": 5},
                             headers={"authorization": "Bearer wrong"}).status_code == 401
            for query_vector in msmarco.query_vectors[:20]:
                body = http.post("/v1/query", json={"vector": query_vector.tolist(), "k": 10}).json()
                assert_same_ranking([(h["doc_id"], h["score"]) for h in body["hits"]], oracle.top_k(query_vector, 10))
                assert body["diagnostics"]["shards_answered"] == NUM_SHARDS
                assert {c["replica"] for c in body["diagnostics"]["per_shard"]} <= {
                    f"inproc://shard-{i}" for i in range(NUM_SHARDS)}
            cluster = http.get("/v1/cluster").json()
            assert len(cluster["shards"]) == NUM_SHARDS

            admin = {"authorization": f"Bearer {admin_key}"}
            written = http.post("/v1/documents", headers=admin, json={"documents": [
                {"id": "embedded-new", "title": "new",
                 "vector": fresh.tolist()}]})
            assert written.status_code == 200, written.text
            hits = http.post("/v1/query", json={"vector": fresh.tolist(), "k": 1, "consistency": "session",
                                                "min_seq": written.json()["seq"]}).json()["hits"]
            assert hits[0]["doc_id"] == "embedded-new"

            # collections created at run time live on a node inside this process too
            created = http.put("/v1/collections/notes", headers=admin, json={"dim": 8, "shards": 2})
            assert created.status_code == 201, created.text
            assert created.json()["placement"] == [["node-0"], ["node-0"]]
            two = http.put("/v1/collections/pairs", headers=admin, json={"dim": 8, "replicas": 2})
            assert two.status_code == 422 and two.json()["error"]["field"] == "replicas", two.text
            notes = [{"id": f"n-{i}", "vector": v.tolist()} for i, v in enumerate(np.eye(8, dtype=np.float32))]
            assert http.post("/v1/collections/notes/documents", headers=admin,
                             json={"documents": notes}).status_code == 200
            hits = http.post("/v1/collections/notes/query", json={"vector": notes[3]["vector"], "k": 1}).json()
            assert hits["hits"][0]["doc_id"] == "n-3", hits
            assert Path(f"/proc/{serve.pid}/task/{serve.pid}/children").read_text().split() == []

            refused = http.put("/admin/faults/0/0", headers=admin, json={"spec": "latency=fixed:50"})
            assert refused.status_code == 404 and refused.json()["error"]["field"] == "replica"
            assert "--backend process" in refused.json()["error"]["message"]
    finally:
        if serve.poll() is None:
            stop(serve)

    serve, url, read_key, _ = start(root, tmp_path / "work2")  # the write is in shard's write-ahead log
    try:
        with httpx.Client(base_url=url, timeout=30, headers={"authorization": f"Bearer {read_key}"}) as http:
            hits = http.post("/v1/query", json={"vector": fresh.tolist(), "k": 1}).json()["hits"]
            assert hits[0]["doc_id"] == "embedded-new"
            assert http.get("/v1/documents/embedded-new").json()["title"] == "new"
            # the created collection came back from its node's files (its writes from the node's WAL)
            hits = http.post("/v1/collections/notes/query", json={"vector": [0, 0, 0, 0, 0, 1.0, 0, 0], "k": 1})
            assert hits.status_code == 200 and hits.json()["hits"][0]["doc_id"] == "n-5", hits.text
    finally:
        if serve.poll() is None:
            stop(serve)


def test_replicas_are_refused_with_the_flag_named(tmp_path):
    refused = subprocess.run(SHARDRAG + ["serve", "--backend", "embedded", "--collection", "x", "--root",
                                         str(tmp_path), "--replicas", "2"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "replicas" in refused.stderr and "--backend process" in refused.stderr
