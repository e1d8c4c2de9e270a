"""A lease kept alive in the background, and how long its holder may still trust it.

:class:`LeaseKeeper` grants a lease and renews it every ``ttl_s / 3`` on its own thread. Its
holder asks :meth:`LeaseKeeper.valid_for_s` before acting on what the lease protects (a primary
before it acknowledges a write): the answer is measured on this process's monotonic clock from
the moment the last successful renewal was *sent*, minus a safety margin, so it never claims
more than the coordinator grants — and a process that was paused (SIGSTOP, a long GC, a VM
migration) sees its lease lapsed the moment it wakes, before it does anything else.

When a renewal finds the lease already lapsed, a new one is granted and ``on_new_lease`` runs
(re-register the keys that lapsed with the old one). The first grant, in :meth:`start`, does not
call it: the holder registers once it has the keeper.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from clusterstate.kv import KV, LeaseExpired
from retrieval.errors import CoordinatorUnavailable

logger = logging.getLogger(__name__)

SAFETY_MARGIN = 0.2  # of the TTL: clocks of two machines may run at slightly different rates


class LeaseKeeper:
    def __init__(self, kv: KV, ttl_s: float, *, name: str, on_new_lease: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kv = kv
        self.ttl_s = ttl_s
        self.name = name
        self._listeners: list[Callable[[int], None]] = [on_new_lease] if on_new_lease is not None else []
        self._clock = clock
        self.lease = 0
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> LeaseKeeper:
        self._renew()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"lease-{self.name}")
        self._thread.start()
        return self

    def valid_for_s(self) -> float:
        """Seconds this process may still rely on the lease (≤ 0: it may have lapsed)."""
        return self._valid_until - self._clock()

    def _renew(self) -> None:
        with self._lock:
            sent = self._clock()
            fresh = False
            replaced = self.lease != 0  # a lease that lapsed is being replaced (not the first grant)
            lapsed = not self.lease
            if self.lease:
                try:
                    ttl = self.kv.keepalive(self.lease)
                except LeaseExpired:
                    logger.warning("%s: lease %d lapsed; taking a new one", self.name, self.lease)
                    self._valid_until, lapsed = 0.0, True
            if lapsed:
                # ``lease`` keeps the lapsed id until a new one is granted, never 0: holders read it
                # from other threads, and a key put on lease 0 has no lease at all — a primary's
                # claim made so would outlive its holder and keep its shard from electing forever.
                self.lease = self.kv.grant(self.ttl_s)
                ttl, fresh = self.ttl_s, True
            self._valid_until = sent + ttl * (1.0 - SAFETY_MARGIN)
        if fresh and replaced:
            for listener in list(self._listeners):
                listener(self.lease)

    def subscribe(self, on_new_lease: Callable[[int], None]) -> None:
        """Another holder of keys on this lease (the replicas of one node share their node's lease):
        told, like ``on_new_lease``, when a lapsed lease was replaced."""
        self._listeners.append(on_new_lease)

    def unsubscribe(self, on_new_lease: Callable[[int], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(on_new_lease)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3.0):
            try:
                self._renew()
            except CoordinatorUnavailable as exc:
                logger.warning("%s: lease renewal failed: %s", self.name, exc.message)
            except Exception:  # noqa: BLE001 - the keeper must keep trying
                logger.exception("%s: lease renewal failed", self.name)

    def stop(self, *, revoke: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if revoke and self.lease:
            try:
                self.kv.revoke(self.lease)
            except CoordinatorUnavailable:
                pass
        self.lease, self._valid_until = 0, 0.0
