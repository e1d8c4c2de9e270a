"""The balancer registry: policy name → class. The one module that knows every policy, so the
policy modules need not know each other (and the config can be checked against the names)."""

from __future__ import annotations

import random
import time

from retrieval.errors import ConfigError
from serving.shardcall.balancer import (
    Balancer,
    Clock,
    LeastOutstandingBalancer,
    RandomBalancer,
    RoundRobinBalancer,
)
from serving.shardcall.p2c_peak_ewma import PeakEwmaBalancer

POLICIES: dict[str, type[Balancer]] = {
    "round_robin": RoundRobinBalancer,
    "random": RandomBalancer,
    "least_outstanding": LeastOutstandingBalancer,
    "p2c_peak_ewma": PeakEwmaBalancer,
}
BALANCERS = tuple(POLICIES)


def make_balancer(name: str, *, clock: Clock = time.monotonic, rng: random.Random | None = None) -> Balancer:
    policy = POLICIES.get(name)
    if policy is None:
        raise ConfigError(f"unknown balancer {name!r}; use one of {list(BALANCERS)}", field="balancer")
    return policy(clock=clock, rng=rng)
