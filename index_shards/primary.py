"""The primary's jobs: it alone orders its shard's writes (Elasticsearch's primary term and
sequence numbers, Kafka's leader epoch).

**A write** (:meth:`PrimaryWriter.write`), per version, under that version's write lock:

1. refuse unless this replica is the primary and its lease is still safe to act on
   (``NotPrimary``: the gateway looks the primary up again), and unless the writer's cluster view
   is current (``StaleView``: while a fence holds, a write sent under an older rollout generation
   than the fence's is refused — a gateway that records a rollout step fences every primary, so a
   gateway that has not seen the step yet reloads before it writes again);
2. a request whose idempotency key this shard already applied is answered from its first
   outcome (``duplicate``) and applies nothing;
3. number the batch (seq under this term), send it to every other in-sync replica while logging
   it here (fsync) and applying it;
4. a replica that does not take it is removed from the in-sync set in the cluster state (a
   compare-and-swap that only succeeds while this primary's term is current) *before* the write
   is acknowledged without it — so every acknowledged write is on every in-sync replica, and any
   of them can be promoted without losing one;
5. acknowledge when the batch is durable on ``write_ack`` of the shard's replicas and the lease
   still holds; otherwise the caller gets an error (the outcome is then unknown: a retry with the
   same idempotency key applies it at most once).

**On promotion** (:meth:`PrimaryWriter.establish`): a no-op record under the new term goes to
every in-sync replica, so each of them knows the term (and refuses the old primary) and has
every record the new primary has; one that cannot take it leaves the in-sync set.

**Bringing a replica in** (:meth:`PrimaryWriter.bring_in`): a live replica outside the in-sync
set is compared with this primary (applied seq and the checksum of its last record): behind, it
is sent the log it misses (or a snapshot, when that log is compacted away); diverged (it holds
records this primary does not), it is restored from a snapshot. The last stretch is sent under
every write lock, and the replica joins the in-sync set before the locks are released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from httpkit import tracing
from index_shards import snapshots
from index_shards.peers import PeerClient
from index_shards.slot import VersionSlot
from index_shards.writes import append_locked, maybe_compact
from retrieval.contract import WriteReply, needed_copies
from retrieval.errors import (
    NotFound,
    NotPrimary,
    ReplicaBehind,
    ShardragError,
    ShardUnavailable,
    StaleView,
    VersionConflict,
)
from retrieval.records import NOOP, WalRecord, decode_records, encode_records

if TYPE_CHECKING:
    from index_shards.versions import ShardVersions

logger = logging.getLogger(__name__)

CATCH_UP_BATCH = 2000  # records per catch-up request
CLOSE_ENOUGH = 100  # a replica this close is brought in under the write locks


@dataclass(slots=True, frozen=True)
class RoleView:
    """The role's state as one write sees it. Replicas are named by their stable ids (a replica
    keeps its id across restarts and new ports); ``urls`` reaches the live ones."""

    replica: str
    term: int
    is_primary: bool
    primary: str | None
    in_sync: tuple[str, ...]
    replicas: tuple[str, ...]
    lease_valid_s: float
    urls: Mapping[str, str] = field(default_factory=dict)  # replica id → where it is reached (live ones)
    replication: int = 0  # the shard's configured replicas (0: as many as have registered)

    def needed(self, ack: str) -> int:
        """Durable copies ``ack`` needs on this shard."""
        return needed_copies(ack, max(self.replication or len(self.replicas), 1))


class Role(Protocol):
    def view(self) -> RoleView: ...

    def drop_from_in_sync(self, replicas: Sequence[str], term: int) -> bool: ...

    def add_to_in_sync(self, replica: str, term: int) -> bool: ...


@dataclass(slots=True, frozen=True)
class PrimarySettings:
    replicate_timeout_s: float = 5.0  # a replica that has not taken a batch by then leaves the in-sync set
    snapshot_timeout_s: float = 120.0  # copying a whole version to a replica


class PrimaryWriter:
    def __init__(self, versions: ShardVersions, role: Role, peers: PeerClient,
                 settings: PrimarySettings | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.versions = versions
        self.role = role
        self.peers = peers
        self.settings = settings or PrimarySettings()
        self._fence = 0  # writes sent under an older rollout generation than this are refused ...
        self._fence_until = 0.0  # ... until then (a fence lapses: its setter may die before it lifts it)
        self._clock = clock

    # -- a write -------------------------------------------------------------------------------
    def _check_primary(self) -> RoleView:
        view = self.role.view()
        if not view.is_primary:
            raise NotPrimary(f"this replica of shard {self.versions.shard_id} is not its primary (term {view.term}, "
                             f"primary {view.primary or 'being elected'})", field="primary",
                             shard=self.versions.shard_id)
        if view.lease_valid_s <= 0 and not self.versions.ignore_terms():  # index_shards.faults' broken build
            raise NotPrimary(f"shard {self.versions.shard_id}: this primary's lease has lapsed; it may have been "
                             "replaced", field="primary", shard=self.versions.shard_id)
        return view

    def fence(self, generation: int, hold_s: float) -> dict[str, object]:
        """Refuse writes sent under a rollout generation older than ``generation`` for ``hold_s``
        seconds (a newer fence replaces an older one). Returns the fence, whether this replica is
        the primary, and each version's applied seq *after* every write that passed the old fence
        has finished: a write checks the fence under its version's write lock, and the seqs are
        read under it too, so no write of an older view lands past them."""
        if generation >= self._fence or self._clock() >= self._fence_until:
            self._fence, self._fence_until = generation, max(self._fence_until, self._clock() + hold_s)
        applied: dict[str, int] = {}
        for slot in self.versions.slots():
            with slot.write_lock:
                if slot.live is not None:
                    applied[slot.version_id] = slot.live.applied_seq
        return {"shard_id": self.versions.shard_id, "generation": self._fence, "applied_seq": applied,
                "is_primary": self.role.view().is_primary}

    def _check_view(self, generation: int) -> None:
        if generation < self._fence and self._clock() < self._fence_until:
            raise StaleView(f"this write was sent under rollout generation {generation}; generation {self._fence} "
                            "is current — reload the cluster state and retry", field="generation",
                            shard=self.versions.shard_id)

    def write(self, version: str, records: Sequence[WalRecord], ack: str, generation: int) -> WriteReply:
        """Sequence, log, replicate and acknowledge one batch (module docstring)."""
        with tracing.span("primary.apply", **{"shardrag.shard": self.versions.shard_id, "shardrag.version": version,
                                               "shardrag.records": len(records), "shardrag.ack": ack}):
            return self._write(version, records, ack, generation)

    def _write(self, version: str, records: Sequence[WalRecord], ack: str, generation: int) -> WriteReply:
        view = self._check_primary()
        self._check_view(generation)
        slot = self.versions.writable_slot(version)
        key = records[0].key if records else ""
        with slot.write_lock:
            live, log = slot.live, slot.log
            assert live is not None and log is not None
            view = self._check_primary()  # the lock may have been waited for
            self._check_view(generation)  # ... and a fence set meanwhile (fence() reads the seqs under this lock)
            if key:
                earlier = log.keys.get(key)
                if earlier is not None:
                    if earlier.fingerprint != records[0].fingerprint:
                        raise VersionConflict(f"idempotency_key {key!r} was used for a different request; use a "
                                              "new key for new content", field="idempotency_key")
                    return WriteReply(self.versions.shard_id, version, earlier.first_seq, earlier.last_seq,
                                      view.term, len(view.in_sync), duplicate=True, doc_ids=earlier.doc_ids)
            first = live.applied_seq + 1
            numbered = [r.sequenced(first + i, view.term) for i, r in enumerate(records)]
            copies = self._replicate_locked(slot, view, numbered)
            needed = view.needed(ack)
            if copies < needed:
                raise ShardUnavailable(f"shard {self.versions.shard_id}: the write is durable on {copies} of the "
                                       f"{needed} replicas write_ack {ack!r} needs (the others are out of sync); its "
                                       "outcome is unknown: retry it with the same idempotency_key",
                                       shard=self.versions.shard_id)
            if self.role.view().lease_valid_s <= 0:
                raise NotPrimary(f"shard {self.versions.shard_id}: this primary's lease lapsed during the write; its "
                                 "outcome is unknown: retry it with the same idempotency_key", field="primary",
                                 shard=self.versions.shard_id)
        maybe_compact(self.versions, slot)
        last = numbered[-1].seq if numbered else live.applied_seq
        return WriteReply(self.versions.shard_id, version, first, last, view.term, copies)

    def _replicate_locked(self, slot: VersionSlot, view: RoleView, records: Sequence[WalRecord]) -> int:
        """Send ``records`` to the other in-sync replicas while logging them here; drop those that
        did not take them from the in-sync set. Copies durable (this one included). The caller
        holds the version's write lock."""
        log = slot.log
        assert log is not None
        if not records:
            return len(view.in_sync)
        prev = log.mark(records[0].seq - 1)
        payload = encode_records(records)
        others = [r for r in view.in_sync if r != view.replica]
        deadline = self._clock() + self.settings.replicate_timeout_s
        failed: list[str] = []
        # the batch goes out to every replica first (the sends do not wait), then this replica logs
        # and applies it while they do the same, then their answers are read: no thread handoff
        waiting: dict[str, Callable[[float], int]] = {}
        for peer in others:
            url = view.urls.get(peer, "")
            try:
                if not url:
                    raise ShardUnavailable("the replica is not registered as live (its lease lapsed)")
                waiting[peer] = self.peers.send(url, slot.version_id, view.term, prev, payload,
                                                self.settings.replicate_timeout_s)
            except ShardragError as exc:
                self._leaves(peer, records, exc, failed)
        append_locked(self.versions, slot, records)
        for peer, answer in waiting.items():
            try:
                try:
                    answer(max(deadline - self._clock(), 0.001))
                except ReplicaBehind:  # it misses earlier records: they go first, then the batch again
                    url = view.urls[peer]
                    self._send_log(url, slot, view.term, upto=records[0].seq - 1)
                    self.peers.replicate(url, slot.version_id, view.term, prev, payload,
                                         max(deadline - self._clock(), 0.001))
            except ShardragError as exc:
                self._leaves(peer, records, exc, failed)
        if failed and not self.role.drop_from_in_sync(failed, view.term):
            raise NotPrimary(f"shard {self.versions.shard_id}: a newer primary has taken over; this write's outcome "
                             "is unknown: retry it with the same idempotency_key", field="primary",
                             shard=self.versions.shard_id)
        return 1 + len(others) - len(failed)

    def _leaves(self, peer: str, records: Sequence[WalRecord], error: ShardragError, failed: list[str]) -> None:
        logger.warning("shard %d: %s did not take seq %d..%d (%s); leaving the in-sync set", self.versions.shard_id,
                       peer, records[0].seq, records[-1].seq, error.message)
        failed.append(peer)

    def _send_log(self, peer: str, slot: VersionSlot, term: int, upto: int) -> int:
        """Send ``peer`` the records of this primary's log it misses, up to ``upto``; its applied
        seq after. NotFound when the log no longer holds them (the caller sends a snapshot)."""
        log = slot.log
        assert log is not None
        held = self.peers.info(peer, self.settings.replicate_timeout_s).held().get(slot.version_id)
        applied = held.applied_seq if held is not None and held.applied_seq is not None else 0
        first = log.first_seq
        if applied < upto and (first is None or applied + 1 < first):
            raise NotFound(f"{peer} is at seq {applied}; this primary's log starts at {first}", field="after")
        batch: list[WalRecord] = []
        for record in log.records_after(applied):
            if record.seq > upto:
                break
            batch.append(record)
            if len(batch) >= CATCH_UP_BATCH:
                applied = self._send_batch(peer, slot, term, batch)
                batch = []
        if batch:
            applied = self._send_batch(peer, slot, term, batch)
        return applied

    def _send_batch(self, peer: str, slot: VersionSlot, term: int, batch: list[WalRecord]) -> int:
        assert slot.log is not None
        return self.peers.replicate(peer, slot.version_id, term, slot.log.mark(batch[0].seq - 1),
                                    encode_records(batch), self.settings.replicate_timeout_s)

    # -- promotion -----------------------------------------------------------------------------
    def establish(self) -> None:
        """A new primary's first act in every writable version: a no-op under its term (module
        docstring). Replicas that cannot take it leave the in-sync set."""
        for slot in self.versions.slots():
            if slot.log is None or slot.live is None:
                continue
            with slot.write_lock:
                view = self.role.view()
                if not view.is_primary:
                    return
                noop = WalRecord(slot.live.applied_seq + 1, NOOP, "", term=view.term)
                self._replicate_locked(slot, view, [noop])
        logger.warning("shard %d: primary of term %d established", self.versions.shard_id, self.role.view().term)

    # -- bringing a replica in -------------------------------------------------------------------
    def bring_in(self, replica: str, peer: str) -> bool:
        """Catch ``replica`` (reached at ``peer``) up on every writable version and add it to the
        in-sync set (module docstring). False when it cannot join yet (it lacks a version, or the
        primary changed)."""
        view = self.role.view()
        if not view.is_primary or replica in view.in_sync:
            return False
        slots = [s for s in self.versions.slots() if s.log is not None]
        info = self.peers.info(peer, self.settings.replicate_timeout_s)
        held = info.ready_versions()
        if any(s.version_id not in held for s in slots):
            return False  # it loads the version first (the gateways reconcile replicas with the rollout state)
        for slot in slots:
            self._catch_up(peer, slot, view.term, held[slot.version_id].applied_seq or 0,
                           held[slot.version_id].last_checksum)
        ordered = sorted(slots, key=lambda s: s.version_id)
        for slot in ordered:
            slot.write_lock.acquire()
        try:
            view = self.role.view()
            if not view.is_primary:
                return False
            for slot in ordered:
                assert slot.live is not None
                self._send_log(peer, slot, view.term, upto=slot.live.applied_seq)
            joined = self.role.add_to_in_sync(replica, view.term)
        finally:
            for slot in reversed(ordered):
                slot.write_lock.release()
        if joined:
            logger.warning("shard %d: %s caught up and joined the in-sync set", self.versions.shard_id, replica)
        return joined

    def _catch_up(self, peer: str, slot: VersionSlot, term: int, applied: int, last_checksum: int | None) -> None:
        """Bring ``peer`` close to this primary on one version without holding its write lock."""
        live, log = slot.live, slot.log
        assert live is not None and log is not None
        mine = log.mark(applied)
        diverged = applied > live.applied_seq or (
            applied > 0 and mine is not None and last_checksum is not None and mine.checksum != last_checksum)
        if diverged:
            logger.warning("shard %d, %s: %s holds records this primary does not (seq %d); restoring it from a "
                           "snapshot", self.versions.shard_id, slot.version_id, peer, applied)
            self._restore(peer, slot, term, force=True)
            return
        if live.applied_seq - applied <= CLOSE_ENOUGH:
            return
        try:
            self._send_log(peer, slot, term, upto=live.applied_seq)
        except NotFound:
            self._restore(peer, slot, term, force=False)

    def _restore(self, peer: str, slot: VersionSlot, term: int, *, force: bool) -> None:
        snapshot = snapshots.take(self.versions, slot.version_id)
        self.peers.restore(peer, slot.version_id, term, snapshot, force, self.settings.snapshot_timeout_s)

    def close(self) -> None:
        self.peers.close()


def decode_unsequenced(payload: bytes) -> list[WalRecord]:
    """A gateway's batch for the primary: records with seq 0 (the primary numbers them)."""
    records = decode_records(payload)
    if any(r.seq != 0 or r.term != 0 for r in records):
        raise VersionConflict("a write to the primary carries no seq or term: the primary numbers it",
                              field="body")
    return records
