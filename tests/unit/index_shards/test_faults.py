"""Fault injection is a real, configurable feature of the shard server (off by default)."""

import pytest
from fastapi.testclient import TestClient

from index_shards.build import BuildConfig, build_collection
from index_shards.faults import FaultConfig, FaultInjector
from index_shards.layout import resolve_version, shard_dir
from index_shards.server import ShardServerConfig, create_app
from index_shards.shard import Shard
from retrieval.errors import InvalidRequest
from tests.conftest import random_corpus


def test_spec_parsing_and_validation():
    config = FaultConfig.parse("latency=lognormal:2:0.5,stall=0.05:100,errors=0.01:500,hang=0.001,slowdown=5,seed=3")
    assert config.latency == "lognormal:2:0.5" and config.stall_probability == 0.05 and config.stall_ms == 100
    assert config.error_rate == 0.01 and config.error_status == 500 and config.hang_probability == 0.001
    assert config.slowdown == 5 and config.seed == 3 and config.active
    assert not FaultConfig.parse("").active
    for bad, field in (("stall=1.5:10", "stall_probability"), ("latency=gauss:1", "latency"),
                       ("errors=0.1:404", "error_status"), ("bogus=1", "faults"), ("slowdown=0.5", "slowdown")):
        with pytest.raises(InvalidRequest) as info:
            FaultConfig.parse(bad)
        assert info.value.field == field


def test_dice_follow_the_configured_rates():
    injector = FaultInjector(FaultConfig(stall_probability=0.1, stall_ms=50, error_rate=0.02, seed=1))
    plans = [injector.plan_before() for _ in range(10_000)]
    errors = sum(status is not None for _, status, _ in plans)
    stalls = sum(delay >= 0.05 for delay, _, _ in plans)
    assert 150 < errors < 250 and 850 < stalls < 1100
    assert injector.injected["errors"] == errors and injector.injected["stalls"] == stalls
    fixed = FaultInjector(FaultConfig(latency="fixed:7"))
    assert fixed.plan_before() == (0.007, None, False)


@pytest.fixture
def shard_client(tmp_path):
    documents, vectors, version = random_corpus(n=200, dim=8)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("f", 1), show_progress=False)
    shard = Shard.load(shard_dir(resolve_version(tmp_path, "f")[0], 0), device="cpu")
    with TestClient(create_app(shard, ShardServerConfig())) as client:
        yield client, vectors[:1].astype("<f4").tobytes()


def test_admin_endpoint_switches_faults_at_run_time(shard_client):
    client, body = shard_client
    assert client.get("/admin/faults").json()["active"] is False
    assert client.post("/v1/search?k=3", content=body).status_code == 200
    response = client.put("/admin/faults", json={"error_rate": 1.0, "error_status": 500})
    assert response.status_code == 200 and response.json()["active"]
    failed = client.post("/v1/search?k=3", content=body)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "injected_fault"
    assert client.get("/admin/faults").json()["injected"]["errors"] == 1
    assert client.put("/admin/faults", json={}).json()["active"] is False
    assert client.post("/v1/search?k=3", content=body).status_code == 200


@pytest.mark.parametrize("payload, field", [({"error_rate": 2}, "error_rate"), ({"nope": 1}, "nope"),
                                            ({"latency": "fixed:x"}, "latency"), ([1, 2], "body")])
def test_admin_endpoint_rejects_bad_settings(shard_client, payload, field):
    client, _ = shard_client
    response = client.put("/admin/faults", json=payload)
    assert response.status_code == 422 and response.json()["error"]["field"] == field


def test_expired_work_is_dropped_before_the_search(shard_client):
    client, body = shard_client
    client.put("/admin/faults", json={"latency": "fixed:50"})
    response = client.post("/v1/search?k=3", content=body, headers={"x-shardrag-timeout-ms": "20"})
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    assert "shardrag_shard_expired_requests_total 1.0" in client.get("/metrics").text
    ok = client.post("/v1/search?k=3", content=body, headers={"x-shardrag-timeout-ms": "500"})
    assert ok.status_code == 200
    bad = client.post("/v1/search?k=3", content=body, headers={"x-shardrag-timeout-ms": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "x-shardrag-timeout-ms"


def test_hang_waits_for_the_client_and_ignores_the_deadline():
    import asyncio

    from httpkit.asgi import ClientDisconnected

    waits = []

    async def wait(seconds, honour_deadline=True):
        waits.append((seconds, honour_deadline))

    injector = FaultInjector(FaultConfig(hang_probability=1.0))
    with pytest.raises(ClientDisconnected):
        asyncio.run(injector.before_search(wait))
    assert waits == [(float("inf"), False)] and injector.injected["hangs"] == 1


def test_slowdown_and_slow_start():
    clock = [0.0]
    injector = FaultInjector(FaultConfig(slowdown=5.0, slow_start_s=10.0), clock=lambda: clock[0])
    assert injector.extra_service_s(0.002) == pytest.approx(0.008)
    assert injector.plan_before()[0] == pytest.approx(1.0)  # a tenth of the 10 s warm-up left
    clock[0] = 5.0
    assert injector.plan_before()[0] == pytest.approx(0.5)
    clock[0] = 11.0
    assert injector.plan_before()[0] == 0.0
