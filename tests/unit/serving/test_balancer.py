"""Every balancer policy, on an injected clock and seeded randomness."""

import random
from collections import Counter

import pytest

from retrieval.errors import ConfigError
from serving.shardcall.balancer import LeastOutstandingBalancer, RandomBalancer, RoundRobinBalancer
from serving.shardcall.p2c_peak_ewma import PeakEwmaBalancer
from serving.shardcall.policies import BALANCERS, make_balancer
from tests.unit.serving.fakes import Clock

REPLICAS = ["a", "b", "c"]


def test_round_robin_cycles_per_shard_and_honours_exclude():
    balancer = RoundRobinBalancer()
    assert [balancer.pick(0, REPLICAS) for _ in range(4)] == ["a", "b", "c", "a"]
    assert balancer.pick(1, REPLICAS) == "a"  # each shard has its own cursor
    assert all(balancer.pick(0, REPLICAS, exclude={"a", "b"}) == "c" for _ in range(3))


@pytest.mark.parametrize("name", BALANCERS)
def test_every_policy_avoids_excluded_unless_nothing_else(name):
    balancer = make_balancer(name, clock=Clock(), rng=random.Random(1))
    for _ in range(50):
        assert balancer.pick(0, REPLICAS, exclude={"a", "c"}) == "b"
    assert balancer.pick(0, ["a"], exclude={"a"}) == "a"
    with pytest.raises(ConfigError):
        balancer.pick(0, [])


def test_random_uses_the_injected_rng():
    picks = [RandomBalancer(rng=random.Random(7)).pick(0, REPLICAS) for _ in range(1)]
    again = [RandomBalancer(rng=random.Random(7)).pick(0, REPLICAS) for _ in range(1)]
    assert picks == again
    counts = Counter(RandomBalancer(rng=random.Random(3)).choose(0, REPLICAS) for _ in range(1))
    assert sum(counts.values()) == 1
    spread = Counter()
    balancer = RandomBalancer(rng=random.Random(3))
    for _ in range(3000):
        spread[balancer.pick(0, REPLICAS)] += 1
    assert all(900 < n < 1100 for n in spread.values())


def test_least_outstanding_prefers_the_idle_replica():
    balancer = LeastOutstandingBalancer(rng=random.Random(0))
    balancer.on_start("a")
    balancer.on_start("a")
    balancer.on_start("b")
    assert balancer.pick(0, REPLICAS) == "c"
    balancer.on_start("c")
    balancer.on_start("c")
    assert balancer.pick(0, REPLICAS) == "b"
    balancer.on_finish("a", 0.01, ok=True)
    balancer.on_finish("a", 0.01, ok=True)
    assert balancer.pick(0, REPLICAS) == "a"


def test_peak_ewma_jumps_to_peaks_and_decays_with_time():
    clock = Clock()
    balancer = PeakEwmaBalancer(clock=clock, rng=random.Random(0), decay_s=10.0, default_latency_s=0.001)
    balancer.on_start("a")
    balancer.on_finish("a", 0.100, ok=True)  # a sample above the estimate replaces it
    assert balancer.latency_estimate_s("a") == pytest.approx(0.100)
    clock.t += 10.0  # one time constant later the estimate has decayed by e
    assert balancer.latency_estimate_s("a") == pytest.approx(0.100 * 0.36788, rel=1e-3)
    clock.t += 1.0
    balancer.on_start("a")
    balancer.on_finish("a", 0.001, ok=True)  # below: blended, not replaced
    estimate = balancer.latency_estimate_s("a")
    assert 0.001 < estimate < 0.100 * 0.36788


def test_peak_ewma_cost_multiplies_load_and_p2c_picks_the_cheaper():
    clock = Clock()
    balancer = PeakEwmaBalancer(clock=clock, rng=random.Random(0))
    for replica, latency in (("a", 0.050), ("b", 0.002), ("c", 0.010)):
        balancer.on_start(replica)
        balancer.on_finish(replica, latency, ok=True)
    picks = Counter(balancer.pick(0, REPLICAS) for _ in range(300))
    assert picks["a"] == 0  # a loses every pairing it is drawn into
    assert picks["b"] > picks["c"] > 0  # b wins its pairings; c wins only against a
    for _ in range(10):
        balancer.on_start("b")  # b is now loaded: cost 0.002 × 11 > 0.010 × 1
    assert balancer.cost("b") > balancer.cost("c")
    assert Counter(balancer.pick(0, ["b", "c"]) for _ in range(20)) == {"c": 20}


def test_peak_ewma_penalises_failures():
    balancer = PeakEwmaBalancer(clock=Clock(), rng=random.Random(0), failure_penalty_s=1.0)
    balancer.on_start("a")
    balancer.on_finish("a", 0.001, ok=False)
    assert balancer.latency_estimate_s("a") == pytest.approx(1.0)
    assert balancer.pick(0, ["a", "b"]) == "b"


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="round_robin"):
        make_balancer("nope")
