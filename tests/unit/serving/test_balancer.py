import pytest

from retrieval.errors import ConfigError
from serving.balancer import RoundRobinBalancer, make_balancer


def test_round_robin_cycles_per_shard_and_honours_exclude():
    balancer = RoundRobinBalancer()
    replicas = ["a", "b", "c"]
    assert [balancer.pick(0, replicas) for _ in range(4)] == ["a", "b", "c", "a"]
    assert balancer.pick(1, replicas) == "a"  # each shard has its own cursor
    assert all(balancer.pick(0, replicas, exclude={"a", "b"}) == "c" for _ in range(3))
    assert balancer.pick(0, ["a"], exclude={"a"}) == "a"  # nothing else left


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="round_robin"):
        make_balancer("nope")
