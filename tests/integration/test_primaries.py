"""Shard primaries with terms, through real processes on the local coordinator: a primary paused
past its lease is replaced under a new term and, when it wakes, is refused and rejoins as a
replica; a write acknowledged with ``write_ack: one`` while the other replicas are away is never
overwritten by their history; a primary that dies between logging a batch and replicating it
leaves no hole that stalls the shard; two servers on one collection or one data dir are refused,
naming the holder. Every check ends with the replicas digest-equal and no seq held by two
replicas with different content."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.records import decode_records
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.roles import primary_index, role_of, wait_all_in_sync

# alone (tests/sharing.py): leases; a failover's term and time asserted
pytestmark = [pytest.mark.slow, pytest.mark.alone]
DIM = 384
LEASE = ("--lease-s", "2")


def vector(seed: int) -> list[float]:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return (v / np.linalg.norm(v)).tolist()


@pytest.fixture()
def root(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents[:200], msmarco.vectors[:200], msmarco.version, BuildConfig("p", 1),
                     show_progress=False)
    return root


def start(root: Path, tmp_path: Path, **gateway: object) -> LocalCluster:
    config = GatewayConfig.from_dict({"encoder": {"load": False}, **gateway})
    return LocalCluster(root, "p", replicas=3, gateway=config, workdir=tmp_path / "work", shard_args=LEASE)


def seq_checksums(url: str, version: str) -> dict[int, int]:
    payload = httpx.get(f"{url}/v1/writes", params={"version": version, "after": 0}, timeout=30).content
    return {r.seq: r.checksum for r in decode_records(payload)}


def assert_converged(urls: list[str], version: str, timeout_s: float = 60.0) -> None:
    """Every replica in sync, digest-equal, and no seq two replicas hold with different content."""
    wait_all_in_sync(urls, timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        digests = [httpx.get(f"{u}/admin/digest", timeout=30).json() for u in urls]
        if len({(d["sha256"], d["applied_seq"]) for d in digests}) == 1:
            break
        assert time.monotonic() < deadline, digests
        time.sleep(0.2)
    logs = [seq_checksums(u, version) for u in urls]
    for seq in set().union(*logs):
        held = {log[seq] for log in logs if seq in log}
        assert len(held) == 1, f"seq {seq} is held with different content: {held}"


def test_a_paused_primary_is_replaced_refused_when_it_wakes_and_rejoins(root, tmp_path, msmarco):
    version = msmarco.version.id
    with start(root, tmp_path) as cluster, httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
        urls = cluster.shard_urls[0]
        wait_all_in_sync(urls)
        old = primary_index(urls)
        term = role_of(urls[old])["term"]
        assert http.post("/v1/documents", json={"documents": [{"id": "before", "vector": vector(1)}],
                                                "write_ack": "all"}).status_code == 200
        paused = cluster.shards[0][old].process.pid
        os.kill(paused, signal.SIGSTOP)
        try:
            started = time.monotonic()
            during = http.post("/v1/documents", json={"documents": [{"id": "during", "vector": vector(2)}],
                                                      "idempotency_key": "during-1"})
            took = time.monotonic() - started
            assert during.status_code == 200, during.text  # after the lease lapsed, on the new primary
            new = primary_index([u for i, u in enumerate(urls) if i != old])
            new_url = [u for i, u in enumerate(urls) if i != old][new]
            assert role_of(new_url)["term"] == term + 1 and took < 15
        finally:
            os.kill(paused, signal.SIGCONT)
        # the old primary, awake: its own writes are refused (its lease lapsed while it slept) ...
        refused = httpx.post(f"{urls[old]}/v1/primary/writes", params={"version": version, "ack": "one"},
                             content=b"", timeout=10)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_primary"
        # ... a replica refuses a batch from its term ...
        replica = next(u for i, u in enumerate(urls) if i != old and u != new_url)
        stale = httpx.post(f"{replica}/v1/writes", params={"version": version}, content=b"",
                           headers={"x-shardrag-term": str(term)}, timeout=10)
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_term"
        # ... and it rejoins as a replica of the new term, holding every acknowledged write
        deadline = time.monotonic() + 30
        while (r := role_of(urls[old])) is None or r["is_primary"] or r["term"] != term + 1:
            assert time.monotonic() < deadline, r
            time.sleep(0.1)
        assert_converged(urls, version)
        for doc_id in ("before", "during"):
            assert httpx.get(f"{urls[old]}/v1/documents/{doc_id}", timeout=10).status_code == 200


def test_an_ack_one_write_is_never_overwritten_while_its_only_holder_is_away(root, tmp_path, msmarco):
    """Issue 33, item 2: the gateway filled a hole with no-ops when the one replica that held an
    acknowledged ``write_ack: one`` write was away, and the replicas then held equal seqs with
    different contents forever. Now a write is acknowledged only once every in-sync replica has it
    (a replica that does not take it leaves the in-sync set first), and only an in-sync replica can
    become primary: with the write's only holder away the shard takes no writes; when it is back
    it catches the others up."""
    version = msmarco.version.id
    with start(root, tmp_path, writes={"timeout_s": 9.0}) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
        urls = cluster.shard_urls[0]
        wait_all_in_sync(urls)
        holder = primary_index(urls)
        others = [i for i in range(3) if i != holder]
        for i in others:
            os.kill(cluster.shards[0][i].process.pid, signal.SIGSTOP)
        try:
            acked = http.post("/v1/documents", json={"documents": [{"id": "only-one", "vector": vector(3)}],
                                                     "write_ack": "one"})
            assert acked.status_code == 200, acked.text  # durable on the primary; the others left the in-sync set
            holder_id = role_of(urls[holder])["replica"]
            assert role_of(urls[holder])["in_sync"] == [holder_id]
            os.kill(cluster.shards[0][holder].process.pid, signal.SIGSTOP)
        finally:
            for i in others:
                os.kill(cluster.shards[0][i].process.pid, signal.SIGCONT)
        try:
            time.sleep(5)  # well past the holder's lease: nobody may take over from a stale history
            assert all(not (role_of(urls[i]) or {}).get("is_primary") for i in others)
            refused = http.post("/v1/documents", json={"documents": [{"id": "meanwhile", "vector": vector(4)}],
                                                       "write_ack": "one"})
            assert refused.status_code == 503, refused.text  # unavailable, never a divergent history
            assert f"only {holder_id} hold every acknowledged write" in refused.json()["error"]["message"]
        finally:
            os.kill(cluster.shards[0][holder].process.pid, signal.SIGCONT)
        assert_converged(urls, version)
        for url in urls:
            assert httpx.get(f"{url}/v1/documents/only-one", timeout=10).status_code == 200


def test_a_primary_dying_mid_write_leaves_no_hole_that_stalls_the_shard(root, tmp_path, msmarco):
    """Issue 33, item 1: a seq taken that reached no replica blocked every later write to the shard
    while anyone kept writing (5 s of steady writing: 0 ok). Now seqs are the primary's own: a
    primary that dies after logging a batch it never replicated is replaced, the next primary
    numbers on from what it has, and the dead one's orphan record is dropped when it rejoins."""
    version = msmarco.version.id
    with start(root, tmp_path) as cluster:
        urls = cluster.shard_urls[0]
        wait_all_in_sync(urls)
        victim = primary_index(urls)
        assert httpx.put(f"{urls[victim]}/admin/faults", json={"crash_at": "after_wal_append"},
                         timeout=10).status_code == 200
        results: list[tuple[float, int]] = []
        stop = threading.Event()

        def writer() -> None:
            with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
                n = 0
                while not stop.is_set():
                    n += 1
                    r = client.post("/v1/documents", json={"documents": [{"id": f"steady-{n}", "vector": vector(n)}],
                                                          "idempotency_key": f"steady-{n}"})
                    results.append((time.monotonic(), r.status_code))

        thread = threading.Thread(target=writer)
        started = time.monotonic()
        thread.start()
        time.sleep(12)
        stop.set()
        thread.join()
        ok = [t for t, status in results if status == 200]
        assert ok and ok[-1] - started > 6, results  # writes go on after the crash and failover
        assert len([t for t in ok if t > started + 6]) >= 5, results
        assert_converged(urls, version)


def test_a_second_server_of_a_collection_or_a_data_dir_is_refused_naming_the_holder(root, tmp_path):
    shardrag = [sys.executable, "-m", "serving"]
    first = subprocess.Popen(shardrag + ["serve", "--collection", "p", "--root", str(root), "--port", "0", "--open",
                                         "--no-encoder", "--replicas", "1", "--workdir", str(tmp_path / "w1")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner, deadline = "", time.monotonic() + 120
        while "Ctrl-C" not in banner:
            line = first.stdout.readline()
            assert line or first.poll() is None, first.stderr.read()
            banner += line
            assert time.monotonic() < deadline, banner
        url = next(w for w in banner.split() if w.startswith("http://127.0.0.1:") and w.count(":") == 2)
        second = subprocess.run(shardrag + ["serve", "--backend", "embedded", "--collection", "p", "--root",
                                            str(root), "--port", "0", "--open", "--no-encoder"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and "collection 'p'" in second.stderr
        replica_dir = root / "p" / "replicas" / "shard-0-r0"
        shard = next((root / "p").glob("*/shard-0"))
        third = subprocess.run([sys.executable, "-m", "index_shards", "serve", "--dir", str(shard), "--data-dir",
                                str(replica_dir)], capture_output=True, text=True, timeout=120)
        assert third.returncode == 2 and "replica data dir" in third.stderr and "in use by pid" in third.stderr
        query = httpx.post(f"{url}/v1/query", json={"vector": vector(5), "k": 3}, timeout=30)
        assert query.status_code == 200 and query.json()["hits"]  # the first one still serves
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(60)
