"""`shardrag status` and `shardrag faults` against a real cluster with API keys and an internal
token (as `shardrag serve` starts it): the CLI processes talk to the gateway, which proxies fault
settings to the replica with the token the operator never sees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

pytestmark = pytest.mark.slow

READ_KEY, ADMIN_KEY = "read-key-for-tests", "admin-key-for-tests"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, msmarco):
    root = tmp_path_factory.mktemp("root")
    count = 600
    build_collection(root, msmarco.documents[:count], msmarco.vectors[:count], msmarco.version,
                     BuildConfig("ops", 2), show_progress=False)
    with LocalCluster(root, "ops", replicas=1, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                      workdir=tmp_path_factory.mktemp("work"), api_keys=[f"read:{READ_KEY}", f"admin:{ADMIN_KEY}"],
                      internal_token="internal-token-for-tests") as running:
        yield running


def shardrag(cluster, *argv: str, key: str = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serving", *argv, "--url", cluster.gateway_url, "--api-key", key],
                          capture_output=True, text=True, timeout=60)


def test_status_shows_every_replica_and_fails_when_a_shard_has_none_healthy(cluster):
    done = shardrag(cluster, "status", key=READ_KEY)
    assert done.returncode == 0, done.stderr
    for shard in cluster.shards:
        assert shard[0].ready["url"] in done.stdout
    assert "ops" in done.stdout and " up " in done.stdout and "DOWN" not in done.stdout
    victim = cluster.shards[1][0].process
    os.kill(victim.pid, signal.SIGSTOP)  # alive (no restart) but answering nothing: unhealthy
    try:
        stopped = shardrag(cluster, "status", key=READ_KEY)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    assert stopped.returncode == 1, stopped.stdout
    assert "DOWN" in stopped.stdout and "shard 1 has no healthy replica" in stopped.stdout
    deadline = time.monotonic() + 20
    while (again := shardrag(cluster, "status", key=READ_KEY)).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert again.returncode == 0


def test_faults_set_show_clear_through_the_gateway(cluster):
    replica_url = cluster.shards[0][0].ready["url"]
    # the replica itself refuses a caller without the internal token: the gateway holds it
    assert httpx.get(f"{replica_url}/admin/faults", timeout=10).status_code == 401
    done = shardrag(cluster, "faults", "set", "--shard", "0", "--replica", "0", "latency=fixed:40,stall=0.5:10")
    assert done.returncode == 0, done.stderr
    assert "active" in done.stdout and "fixed:40" in done.stdout
    started = time.perf_counter()
    vector = [0.0] * 383 + [1.0]
    response = httpx.post(f"{cluster.gateway_url}/v1/query", json={"vector": vector, "k": 3, "timeout_ms": 5000},
                          headers={"authorization": f"Bearer {READ_KEY}"}, timeout=30)
    assert response.status_code == 200 and time.perf_counter() - started >= 0.04  # shard 0 is 40 ms slower
    shown = shardrag(cluster, "faults", "show", key=ADMIN_KEY)
    assert shown.returncode == 0 and "shard 0 replica 0" in shown.stdout
    assert "fixed:40" in shown.stdout and "shard 1 replica 0" in shown.stdout
    bad = shardrag(cluster, "faults", "set", "--shard", "0", "--replica", "0", "stall=lots")
    assert bad.returncode != 0 and "stall" in (bad.stderr + bad.stdout)
    missing = shardrag(cluster, "faults", "set", "--shard", "7", "--replica", "0", "latency=fixed:1")
    assert missing.returncode != 0 and "shard" in missing.stderr
    read_only = shardrag(cluster, "faults", "show", key=READ_KEY)
    assert read_only.returncode != 0 and "admin" in read_only.stderr
    cleared = shardrag(cluster, "faults", "clear")
    assert cleared.returncode == 0 and cleared.stdout.count("faults off") == 2
    assert "active" not in shardrag(cluster, "faults", "show").stdout
