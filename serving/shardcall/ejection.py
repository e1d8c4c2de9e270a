"""Outlier ejection: replicas that keep failing leave the rotation, with exponential back-off,
and come back only when an active ``/healthz`` probe succeeds.

* ``consecutive_failures`` failures or timeouts in a row eject a replica for
  ``base_ejection_s × 2^(n-1)`` (n = ejections in a row, capped at ``max_ejection_s``);
* once that time has passed the replica is due for a probe (:meth:`due_for_probe`); a good
  probe reinstates it, a bad one ejects it again for longer;
* :meth:`available` never returns an empty list: while any replica is in rotation only those
  are offered, and when every replica is ejected all are offered (better a doubtful answer
  than none).

Time is injected (``clock``) so tests drive it. :func:`probe_ejected` is the background loop
that runs the probes through the shard client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retrieval.errors import ConfigError, ShardragError
from serving.transport.client import ShardClient

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class EjectionSettings:
    after_failures: int = 3  # consecutive failures/timeouts that eject a replica
    base_s: float = 1.0  # first ejection; doubles each time in a row
    max_s: float = 30.0  # longest ejection
    probe_interval_s: float = 0.5  # how often ejected replicas are probed on /healthz

    def validate(self) -> None:
        for name in ("base_s", "max_s", "probe_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ejection.{name} must be > 0", field=f"ejection.{name}")
        if self.after_failures < 1:
            raise ConfigError("ejection.after_failures must be ≥ 1", field="ejection.after_failures")


@dataclass(slots=True)
class _State:
    consecutive_failures: int = 0
    ejections_in_row: int = 0
    ejected_until: float | None = None  # None = in rotation
    reinstated_at: float = 0.0


class OutlierDetector:
    def __init__(self, *, consecutive_failures: int = 3, base_ejection_s: float = 1.0, max_ejection_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_eject: Callable[[str, float], None] | None = None) -> None:
        self.consecutive_failures = consecutive_failures
        self.base_ejection_s = base_ejection_s
        self.max_ejection_s = max_ejection_s
        self.clock = clock
        self.on_eject = on_eject
        self._states: dict[str, _State] = {}

    def _state(self, replica: str) -> _State:
        state = self._states.get(replica)
        if state is None:
            state = self._states[replica] = _State()
        return state

    def is_ejected(self, replica: str) -> bool:
        state = self._states.get(replica)
        return state is not None and state.ejected_until is not None

    def available(self, replicas: Sequence[str]) -> Sequence[str]:
        healthy = [r for r in replicas if not self.is_ejected(r)]
        return healthy or replicas

    def record_success(self, replica: str) -> None:
        state = self._state(replica)
        state.consecutive_failures = 0
        if state.ejected_until is None and self.clock() - state.reinstated_at > self.max_ejection_s:
            state.ejections_in_row = 0  # healthy for a while: forget the back-off

    def record_failure(self, replica: str) -> None:
        state = self._state(replica)
        state.consecutive_failures += 1
        if state.ejected_until is None and state.consecutive_failures >= self.consecutive_failures:
            self._eject(replica, state)

    def _eject(self, replica: str, state: _State) -> None:
        state.ejections_in_row += 1
        duration = min(self.base_ejection_s * 2 ** (state.ejections_in_row - 1), self.max_ejection_s)
        state.ejected_until = self.clock() + duration
        if self.on_eject is not None:
            self.on_eject(replica, duration)

    def due_for_probe(self) -> list[str]:
        now = self.clock()
        return [r for r, s in self._states.items() if s.ejected_until is not None and now >= s.ejected_until]

    def probe_result(self, replica: str, ok: bool) -> None:
        state = self._state(replica)
        if state.ejected_until is None:
            return
        if ok:
            state.ejected_until = None
            state.consecutive_failures = 0
            state.reinstated_at = self.clock()
        else:
            self._eject(replica, state)

    def snapshot(self) -> dict[str, dict[str, float | int | bool]]:
        now = self.clock()
        return {r: {"ejected": s.ejected_until is not None,
                    "ejected_for_s": max(0.0, s.ejected_until - now) if s.ejected_until is not None else 0.0,
                    "consecutive_failures": s.consecutive_failures, "ejections_in_row": s.ejections_in_row}
                for r, s in self._states.items()}


async def probe_ejected(detector: OutlierDetector, client: ShardClient, *, interval_s: float,
                        timeout_s: float) -> None:
    """Forever: bring ejected replicas back once their back-off has passed and /healthz answers."""
    while True:
        await asyncio.sleep(interval_s)
        for replica in detector.due_for_probe():
            try:
                await client.health(replica, timeout_s)
            except ShardragError:
                detector.probe_result(replica, ok=False)
            else:
                logger.info("replica %s answers /healthz again: back in rotation", replica)
                detector.probe_result(replica, ok=True)
