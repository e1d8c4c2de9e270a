"""Chaos in CI: 2 shards × 2 replica processes under steady query load, kill -9 a random
replica every 5 s for 30 s (the supervisor restarts each). No query may fail; any degraded
answer must say which shards it misses; /v1/cluster shows the restarts."""

from __future__ import annotations

import time

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.chaos import ChaosMonkey, QueryLoad
from serving.local.launcher import LocalCluster
from tests.conftest import REPORT

# alone (tests/sharing.py): a kill schedule in real time, full answers asserted between kills
pytestmark = [pytest.mark.slow, pytest.mark.alone]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, msmarco):
    root = tmp_path_factory.mktemp("root")
    build_collection(root, msmarco.documents, msmarco.vectors, msmarco.version, BuildConfig("chaos", 2),
                     show_progress=False)
    config = GatewayConfig.from_dict({"encoder": {"load": False}, "ejection": {"base_s": 0.5, "probe_interval_s": 0.2}})
    with LocalCluster(root, "chaos", replicas=2, gateway=config, workdir=tmp_path_factory.mktemp("work")) as running:
        yield running


def test_kill_a_replica_every_5_s_for_30_s(cluster, msmarco):
    bodies = [{"vector": v.tolist(), "k": 10, "timeout_ms": 3000} for v in msmarco.query_vectors]
    version = cluster.manifest.embedding_version.id
    with ChaosMonkey(cluster, every_s=5.0, seed=7) as monkey, \
            QueryLoad(cluster.gateway_url, bodies, clients=3, expected_versions={version}) as load:
        time.sleep(32.0)
    report = load.report(monkey)
    REPORT.append(f"chaos 30 s, 2×2: {report['requests']} queries, {report['kills']} kills, full "
                  f"{report['full_pct']:.2f} %, partial {report['partial']} (all flagged: "
                  f"{report['partial_unflagged'] == 0}), errors {report['errors']}, p50 {report['p50_ms']:.1f} ms, "
                  f"p99 {report['p99_ms']:.1f} ms")
    assert report["kills"] >= 5, report
    assert report["requests"] > 100
    assert report["errors"] == 0, report["error_examples"]
    assert report["partial_unflagged"] == 0
    assert report["wrong_version"] == 0
    # every victim came back, and the gateway's cluster view says how often each was restarted
    deadline = time.monotonic() + 30
    while not all(c.process.poll() is None and c.ready for g in cluster.shards for c in g):
        assert time.monotonic() < deadline, cluster.status()
        time.sleep(0.2)
    view = httpx.get(f"{cluster.gateway_url}/v1/cluster", timeout=10).json()
    assert view["supervision"]["total_restarts"] >= report["kills"] - 1  # the last may still be restarting
    restarts = {r["url"]: r.get("restarts") for shard in view["shards"] for r in shard["replicas"]}
    assert sum(v or 0 for v in restarts.values()) >= 1
    killed = {c["name"]: c for c in view["supervision"]["children"] if c["restarts"]}
    assert all(c["last_exit_code"] == -9 for c in killed.values())
