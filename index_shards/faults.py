"""Fault injection: a real feature of the shard server, for tests, benchmarks and game days.

Off by default. Configured per replica at start (``--faults`` / ``SHARDRAG_FAULTS``) and at run
time through ``PUT /admin/faults``. What it can do to a search request:

* ``latency``      added delay: ``fixed:MS``, ``uniform:LO_MS:HI_MS`` or ``lognormal:MEDIAN_MS:SIGMA``
* ``stall``        ``P:MS`` — a fraction P of requests is held MS milliseconds
* ``errors``       ``P:STATUS`` — a fraction P is answered with HTTP STATUS (500 or 503)
* ``hang``         ``P`` — a fraction P never answers (held until the client gives up or the deadline)
* ``slowdown``     ``F`` — service time × F (the search runs, then the replica waits (F-1)× as long)
* ``slow_start``   ``S`` — for S seconds after start, requests wait extra (linearly less over time)
* ``seed``         seed of the fault dice (reproducible runs)

And one that is not about searches: ``crash`` — ``after_wal_append`` | ``mid_compaction`` |
``after_checkpoint``: the replica kills itself (SIGKILL, as ``kill -9`` would) the first time its
write path reaches that point (index_shards.versions), for crash-recovery tests and drills.

And one that breaks the write protocol on purpose: ``ignore_terms`` — **a deliberately broken
build**, for proving that the history checker catches lost writes: as a replica it takes records
from any primary, of any term, and answers a seq it already holds as taken whatever its content
(no stale-term, diverged or prev check); as a primary it writes without a valid lease. Never in
production: a deposed primary's acknowledged writes are then silently lost (``ignore_terms=1``).

Spec string: comma-separated ``name=value``, e.g. ``stall=0.05:100,latency=lognormal:1:0.5``.
Delays end early when the client disconnects (a cancelled hedge) or the request's deadline passes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from httpkit.asgi import ClientDisconnected, Receive
from retrieval.errors import InvalidRequest, ShardragError

logger = logging.getLogger(__name__)


CRASH_POINTS = ("after_wal_append", "mid_compaction", "after_checkpoint")


class InjectedFault(ShardragError):
    """An error the fault injector chose to answer with."""

    code = "injected_fault"


@dataclass(slots=True, frozen=True)
class FaultConfig:
    latency: str = "none"  # "none" | "fixed:MS" | "uniform:LO:HI" | "lognormal:MEDIAN_MS:SIGMA"
    stall_probability: float = 0.0  # fraction of requests held stall_ms
    stall_ms: float = 0.0
    error_rate: float = 0.0  # fraction answered with error_status
    error_status: int = 503
    hang_probability: float = 0.0  # fraction never answered
    slowdown: float = 1.0  # service-time multiplier (≥ 1)
    slow_start_s: float = 0.0  # extra delay right after start, fading linearly to 0
    seed: int | None = None
    crash_at: str = "none"  # a write-path point where the replica kills itself (CRASH_POINTS)
    ignore_terms: bool = False  # a deliberately broken build (module docstring): never in production

    def validate(self) -> FaultConfig:
        _parse_latency(self.latency)
        if self.crash_at not in ("none", *CRASH_POINTS):
            raise InvalidRequest(f"crash_at must be one of none, {', '.join(CRASH_POINTS)}; got {self.crash_at!r}",
                                 field="crash_at")
        for name in ("stall_probability", "error_rate", "hang_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InvalidRequest(f"{name} must be between 0 and 1, got {value}", field=name)
        if self.stall_ms < 0:
            raise InvalidRequest("stall_ms must be ≥ 0", field="stall_ms")
        if self.error_status not in (500, 502, 503, 504):
            raise InvalidRequest("error_status must be 500, 502, 503 or 504", field="error_status")
        if self.slowdown < 1.0:
            raise InvalidRequest("slowdown must be ≥ 1", field="slowdown")
        if self.slow_start_s < 0:
            raise InvalidRequest("slow_start_s must be ≥ 0", field="slow_start_s")
        return self

    @property
    def active(self) -> bool:
        return self != FaultConfig(seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultConfig:
        known = set(cls.__dataclass_fields__)
        for key in data:
            if key not in known:
                raise InvalidRequest(f"unknown fault setting {key!r}", field=key)
        try:
            return cls(**data).validate()
        except TypeError as exc:
            raise InvalidRequest(f"bad fault settings: {exc}", field="faults") from exc

    @classmethod
    def parse(cls, spec: str) -> FaultConfig:
        """From the ``name=value,...`` spec string (see the module docstring)."""
        config = cls()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, value = item.partition("=")
            try:
                if name == "latency":
                    config = replace(config, latency=value)
                elif name == "stall":
                    probability, _, ms = value.partition(":")
                    config = replace(config, stall_probability=float(probability), stall_ms=float(ms or 0))
                elif name == "errors":
                    rate, _, status = value.partition(":")
                    config = replace(config, error_rate=float(rate), error_status=int(status or 503))
                elif name == "hang":
                    config = replace(config, hang_probability=float(value))
                elif name == "slowdown":
                    config = replace(config, slowdown=float(value))
                elif name == "slow_start":
                    config = replace(config, slow_start_s=float(value))
                elif name == "crash":
                    config = replace(config, crash_at=value)
                elif name == "ignore_terms":
                    config = replace(config, ignore_terms=value.lower() in ("1", "true", "yes"))
                elif name == "seed":
                    config = replace(config, seed=int(value))
                else:
                    raise InvalidRequest(f"unknown fault {name!r}", field="faults")
            except ValueError as exc:
                raise InvalidRequest(f"fault {item!r}: {exc}", field="faults") from exc
        return config.validate()


def _parse_latency(spec: str) -> Callable[[random.Random], float]:
    """A sampler of added latency in seconds."""
    kind, _, args = spec.partition(":")
    try:
        values = [float(v) for v in args.split(":")] if args else []
        if kind == "none" and not values:
            return lambda rng: 0.0
        if kind == "fixed" and len(values) == 1 and values[0] >= 0:
            return lambda rng: values[0] / 1000.0
        if kind == "uniform" and len(values) == 2 and 0 <= values[0] <= values[1]:
            return lambda rng: rng.uniform(values[0], values[1]) / 1000.0
        if kind == "lognormal" and len(values) == 2 and values[0] > 0 and values[1] >= 0:
            return lambda rng: rng.lognormvariate(math.log(values[0]), values[1]) / 1000.0
    except ValueError:
        pass
    raise InvalidRequest(f"latency must be none, fixed:MS, uniform:LO:HI or lognormal:MEDIAN_MS:SIGMA, not {spec!r}",
                         field="latency")


Waiter = Callable[..., Awaitable[None]]  # (seconds, honour_deadline=True): sleep; ClientDisconnected if the client left


class FaultInjector:
    def __init__(self, config: FaultConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self.set(config or FaultConfig())

    def set(self, config: FaultConfig) -> None:
        self.config = config.validate()
        # Read on every search: worked out once here (comparing dataclasses costs ~25 µs a time).
        self._active = replace(self.config, crash_at="none").active
        self._rng = random.Random(config.seed)
        self._latency = _parse_latency(config.latency)
        self.injected = {"delays": 0, "stalls": 0, "errors": 0, "hangs": 0}

    @property
    def active(self) -> bool:
        """Whether searches are touched (a crash point alone leaves them alone)."""
        return self._active

    def crash_point(self, point: str) -> None:
        """Called by the write path at ``point``: dies there when configured to."""
        if self.config.crash_at == point:
            logger.warning("fault injection: crashing at %s", point)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def plan_before(self) -> tuple[float, int | None, bool]:
        """Dice for one request: (delay before search in s, error status or None, hang)."""
        config = self.config
        if config.hang_probability and self._rng.random() < config.hang_probability:
            self.injected["hangs"] += 1
            return 0.0, None, True
        if config.error_rate and self._rng.random() < config.error_rate:
            self.injected["errors"] += 1
            return 0.0, config.error_status, False
        delay = self._latency(self._rng)
        if config.stall_probability and self._rng.random() < config.stall_probability:
            self.injected["stalls"] += 1
            delay += config.stall_ms / 1000.0
        if config.slow_start_s:
            remaining = config.slow_start_s - (self._clock() - self._started)
            if remaining > 0:
                delay += remaining / 10.0  # at most a tenth of the warm-up left, fading to 0
        if delay:
            self.injected["delays"] += 1
        return delay, None, False

    def extra_service_s(self, service_s: float) -> float:
        return service_s * (self.config.slowdown - 1.0)

    async def before_search(self, wait: Waiter) -> None:
        delay, status, hang = self.plan_before()
        if hang:
            # Never answer: hold until the client gives up (it closes the connection), at most an hour.
            await wait(math.inf, honour_deadline=False)
            raise ClientDisconnected()
        if status is not None:
            raise _status_error(status)
        if delay:
            await wait(delay)


def _status_error(status: int) -> InjectedFault:
    error = InjectedFault(f"injected fault: HTTP {status}")
    error.status_code = status
    return error


async def wait_unless_gone(receive: Receive, seconds: float,
                           deadline: float | None, clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep ``seconds`` (capped at the request deadline), waking early if the client disconnects."""
    if deadline is not None:
        seconds = min(seconds, max(0.0, deadline - clock()))
    if seconds <= 0:
        return
    sleeper = asyncio.ensure_future(asyncio.sleep(seconds if math.isfinite(seconds) else 3600.0))
    listener = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait({sleeper, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        listener.cancel()
    if listener in done and not listener.cancelled() and listener.result().get("type") == "http.disconnect":
        raise ClientDisconnected()
