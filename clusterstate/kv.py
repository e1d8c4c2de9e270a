"""The key-value seam under the cluster state: the part of etcd's API shardrag uses, typed once,
with two implementations — :class:`~clusterstate.etcd.EtcdKV` (a real etcd cluster, through its
gRPC-JSON gateway) and :class:`~clusterstate.local.LocalKV` (one file on one machine, for the
embedded default).

* every key has a ``mod_revision``; :meth:`KV.put` and :meth:`KV.delete` can be made conditional
  on it (``expect_revision``: 0 = the key must be absent) — the compare-and-swap every transition
  of the cluster state is made with;
* a **lease** is a TTL that its holder keeps alive (:meth:`KV.keepalive`); keys put with a lease
  vanish when it lapses (a dead gateway's registration, a primary's claim on its shard);
* :meth:`KV.revision` is the store's revision, which changes with every put or delete: a watcher
  polls it and re-reads only when it moved.

All calls are synchronous and short (control plane, never per write); async callers run them in
a thread. A coordinator that cannot be reached raises
:class:`~retrieval.errors.CoordinatorUnavailable`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from retrieval.errors import CoordinatorUnavailable


class LeaseExpired(CoordinatorUnavailable):
    """The lease lapsed (or was revoked): what it held is gone; take a new one."""

    code = "lease_expired"


@dataclass(slots=True, frozen=True)
class Entry:
    key: str
    value: bytes
    mod_revision: int  # the store revision of the key's last change
    lease: int = 0  # the lease it is attached to (0: none)


class KV(ABC):
    @abstractmethod
    def get(self, key: str) -> Entry | None:
        """The key's entry, or None when it is absent (or its lease lapsed)."""

    @abstractmethod
    def prefix(self, prefix: str) -> list[Entry]:
        """Every entry whose key starts with ``prefix``, in key order."""

    @abstractmethod
    def put(self, key: str, value: bytes, *, expect_revision: int | None = None, lease: int = 0) -> int | None:
        """Set the key; with ``expect_revision`` only if its mod_revision is that (0: only if absent).
        The new revision, or None when the condition did not hold (nothing written)."""

    @abstractmethod
    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        """Remove the key (conditionally, as :meth:`put`); whether something was removed."""

    @abstractmethod
    def grant(self, ttl_s: float) -> int:
        """A new lease of ``ttl_s`` seconds (whole seconds on etcd, at least 1)."""

    @abstractmethod
    def keepalive(self, lease: int) -> float:
        """Renew the lease for its TTL; the TTL granted. LeaseExpired when it already lapsed."""

    @abstractmethod
    def revoke(self, lease: int) -> None:
        """End the lease now (its keys go with it); a lapsed lease is no error."""

    @abstractmethod
    def revision(self) -> int:
        """The store's current revision."""

    def close(self) -> None:  # noqa: B027 - only stores that hold connections close them
        pass
