"""The cluster state's records on the local coordinator's real file: compare-and-swap transitions
of a shard's record, claims that go with their lease, members, the rollout state, and how long a
lease holder may trust its lease (a paused process finds it lapsed the moment it wakes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterstate.lease import SAFETY_MARGIN, LeaseKeeper
from clusterstate.local import LocalKV
from clusterstate.state import Claim, ClusterState, RolloutStoreOnKV, ShardRecord
from retrieval.errors import ConfigError, CoordinatorUnavailable
from retrieval.rollout import RolloutState


@pytest.fixture()
def state(tmp_path) -> ClusterState:
    return ClusterState(LocalKV(tmp_path / "cluster-state.json"), "docs")


def test_shard_transitions_are_compare_and_swap(state):
    assert state.shard(0) == ShardRecord()
    first = state.update_shard(0, lambda r: replace(r, term=1, primary="r0", in_sync=("r0",), replicas=("r0",)))
    assert (first.term, first.primary, first.revision > 0) == (1, "r0", True)
    seen = state.shard(0)
    # two promotions from the same record: only the first one is recorded
    promote = lambda who: lambda current: (None if current.revision != seen.revision  # noqa: E731
                                           else replace(current, term=2, primary=who))
    assert state.update_shard(0, promote("r1")).primary == "r1"
    assert state.update_shard(0, promote("r2")) is None
    assert state.shard(0).primary == "r1" and state.shard(0).term == 2
    unchanged = state.shard(0)
    assert state.update_shard(0, lambda r: r) == unchanged  # nothing to write: nothing written
    assert state.shards() == {0: unchanged}


def test_a_claim_goes_with_its_lease_and_members_are_the_live_ones(state):
    lease = state.kv.grant(60)
    assert state.put_claim(3, Claim("r1", 4), lease)
    assert not state.put_claim(3, Claim("r2", 4), state.kv.grant(60))  # one claim at a time
    assert state.claim(3) == Claim("r1", 4)
    state.register_member(3, "r1", lease, {"url": "http://a:1"})
    assert state.members(3) == {"r1": {"replica": "r1", "url": "http://a:1"}}
    state.kv.revoke(lease)
    assert state.claim(3) is None and state.members(3) == {}
    with pytest.raises(CoordinatorUnavailable):  # a claim on no lease would outlive its holder
        state.put_claim(3, Claim("r2", 5), 0)
    assert state.claim(3) is None


def test_the_rollout_state_and_gateways(state):
    store = RolloutStoreOnKV(state)
    assert store.load() is None
    first = store.update(lambda current: current or RolloutState(active="v1"))
    assert store.load() == first
    with pytest.raises(RuntimeError):
        store.update(lambda current: (_ for _ in ()).throw(RuntimeError("refused")))
    assert store.load() == first  # a change that raises writes nothing
    lease = state.kv.grant(60)
    state.register_gateway("g1", lease, "http://g:1", 7)
    assert state.gateways() == {"g1": {"url": "http://g:1", "generation": 7}}
    assert state.snapshot()["shards"] == {} and state.snapshot()["gateways"]["g1"]["generation"] == 7
    with pytest.raises(ConfigError):
        ClusterState(state.kv, "a/b")


def test_a_paused_lease_holder_sees_its_lease_lapsed_when_it_wakes(tmp_path):
    now = [100.0]
    keeper = LeaseKeeper(LocalKV(tmp_path / "s.json"), 3.0, name="test", clock=lambda: now[0])
    keeper._renew()  # noqa: SLF001 - the first grant, without the renewal thread
    assert keeper.valid_for_s() == pytest.approx(3.0 * (1 - SAFETY_MARGIN))
    now[0] += 10.0  # SIGSTOP for 10 s: the monotonic clock went on
    assert keeper.valid_for_s() < 0


def test_a_lapsed_lease_is_replaced_without_ever_reading_as_no_lease(tmp_path):
    """Holders read ``keeper.lease`` from other threads while it renews: between the lapse and the
    new grant it must still name the lapsed lease, never 0 (a primary's claim put on lease 0 had
    no lease at all and kept its shard from electing: issue 36's session, test_primaries)."""
    now = [100.0]
    seen_while_granting: list[int] = []

    class Watched(LocalKV):
        def grant(self, ttl_s: float) -> int:
            seen_while_granting.append(keeper.lease)
            return super().grant(ttl_s)

    renewed: list[int] = []
    keeper = LeaseKeeper(Watched(tmp_path / "s.json", clock=lambda: now[0]), 3.0, name="test",
                         clock=lambda: now[0], on_new_lease=renewed.append)
    keeper._renew()  # noqa: SLF001 - the first grant, without the renewal thread
    first = keeper.lease
    now[0] += 10.0  # paused past the TTL
    keeper._renew()  # noqa: SLF001
    assert seen_while_granting == [0, first]  # the first grant starts from none; the second from the lapsed one
    assert keeper.lease not in (0, first) and renewed == [keeper.lease]
