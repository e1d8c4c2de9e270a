"""retrieval.auth without processes: key parsing, lookup, the token bucket."""

from __future__ import annotations

import asyncio

import pytest

from httpkit.auth import KeyRing, RateLimiter, gateway_policy, internal_headers, internal_policy
from retrieval.errors import ConfigError

READ, ADMIN = "r" * 20, "a" * 20


def test_keys_from_env_and_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# comment\nadmin:{ADMIN}\n\n")
    ring = KeyRing.from_env({"SHARDRAG_API_KEYS": f"read:{READ}", "SHARDRAG_API_KEYS_FILE": str(path)})
    assert ring.find(READ).scope == "read" and ring.find(ADMIN).scope == "admin"
    assert ring.find("x" * 20) is None and ring.find("") is None
    assert ADMIN not in repr(ring.keys) and ring.find(ADMIN).key_id != ADMIN[:8]  # only digests are kept
    assert KeyRing.from_env({}) is None


@pytest.mark.parametrize("entry", ["root:" + "k" * 20, "read:short", "nocolon"])
def test_bad_key_entries_are_config_errors(entry):
    with pytest.raises(ConfigError):
        KeyRing([entry])


def test_token_bucket_allows_burst_then_the_rate():
    now = [0.0]
    limiter = RateLimiter(2.0, 3, clock=lambda: now[0])
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.take("k")
    assert wait == pytest.approx(0.5)
    assert limiter.take("other") == 0.0  # per caller
    now[0] += 0.5
    assert limiter.take("k") == 0.0


def test_a_cluster_wide_quota_is_split_over_the_live_gateways():
    now, gateways = [0.0], [2]
    limiter = RateLimiter(4.0, 4, clock=lambda: now[0], share=lambda: 1.0 / gateways[0])
    assert [limiter.take("k") for _ in range(2)] == [0.0, 0.0]  # half the burst here
    assert limiter.take("k") == pytest.approx(0.5)  # and half the rate: 2/s
    now[0] += 0.5
    assert limiter.take("k") == 0.0
    gateways[0] = 1  # the other gateway is gone: this one takes the whole quota at once
    now[0] += 0.25
    assert limiter.take("k") == 0.0


def test_live_gateways_share_a_quota_as_they_come_and_go(tmp_path):
    from clusterstate.local import LocalKV
    from clusterstate.state import ClusterState
    from serving.versions.presence import ClusterSettings, GatewayPresence

    state = ClusterState(LocalKV(tmp_path / "state.json"), "docs")
    settings = ClusterSettings(gateway_lease_s=30.0, fence_hold_s=60.0)

    async def reload() -> None:
        return None

    def presence() -> GatewayPresence:
        return GatewayPresence(state, settings, current_generation=lambda: 0, reload=reload).start()

    first, second = presence(), presence()
    try:
        asyncio.run(first.poll())
        assert first.quota_share() == 0.5
        second.stop()  # its registration goes at once
        asyncio.run(first.poll())
        assert first.quota_share() == 1.0
    finally:
        first.stop()
        second.stop()


def test_policies_and_internal_headers():
    assert gateway_policy("GET", "/healthz") is None and gateway_policy("POST", "/v1/query") == "read"
    assert gateway_policy("POST", "/admin/rollout/stage") == "admin"
    assert internal_policy("POST", "/v1/search") == "internal" and internal_policy("GET", "/healthz") is None
    assert internal_headers({"SHARDRAG_INTERNAL_TOKEN": "t"}) == {"x-shardrag-token": "t"}
    assert internal_headers({}) == {}


def test_scoped_keys_parse_and_reach_their_collections_only():
    from httpkit.auth import check_key_reach
    from retrieval.errors import Forbidden

    ring = KeyRing([f"write:{READ} collections=docs+faq tenant=acme rps=2.5", f"admin:{ADMIN}"])
    scoped = ring.find(READ)
    assert scoped.collections == frozenset({"docs", "faq"}) and scoped.tenant == "acme" and scoped.max_rps == 2.5
    assert scoped.scoped and not ring.find(ADMIN).scoped
    for method, path in (("POST", "/v1/collections/docs/query"), ("GET", "/v1/collections"),
                         ("GET", "/v1/collections/faq/documents/x")):
        check_key_reach(scoped, method, path)
    for method, path in (("POST", "/v1/collections/other/query"), ("POST", "/v1/query"), ("GET", "/v1/cluster"),
                         ("DELETE", "/v1/collections/docs"), ("PUT", "/v1/collections/docs")):
        with pytest.raises(Forbidden):
            check_key_reach(scoped, method, path)
    check_key_reach(ring.find(ADMIN), "DELETE", "/v1/collections/docs")
    assert gateway_policy("PUT", "/v1/collections/docs") == "admin"
    assert gateway_policy("POST", "/v1/collections/docs/documents/delete") == "write"
    assert gateway_policy("POST", "/v1/collections/docs/query") == "read"
    # a collection's rollouts take an admin key, and never a tenant's
    assert gateway_policy("GET", "/v1/collections/docs/rollout") == "admin"
    assert gateway_policy("POST", "/v1/collections/docs/rollout/stage") == "admin"
    assert gateway_policy("POST", "/v1/collections/docs/rollouts") == "read"  # not a rollout path: a 404 later
    with pytest.raises(Forbidden):
        check_key_reach(scoped, "POST", "/v1/collections/docs/rollout/activate")
    assert gateway_policy("POST", "/v1/collections/docs/tune") == "admin"
    with pytest.raises(Forbidden):
        check_key_reach(scoped, "POST", "/v1/collections/docs/tune")
    # and so do its query defaults (every query of every tenant of it would change)
    assert gateway_policy("PUT", "/v1/collections/docs/query-defaults") == "admin"
    with pytest.raises(Forbidden):
        check_key_reach(scoped, "PUT", "/v1/collections/docs/query-defaults")


@pytest.mark.parametrize("attributes", ["colors=red", "tenant=", "rps=-1", "rps=x", "tenant=a tenant=b"])
def test_bad_key_attributes_are_config_errors(attributes):
    with pytest.raises(ConfigError):
        KeyRing([f"read:{READ} {attributes}"])
