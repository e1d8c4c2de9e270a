"""A replica's place in its shard's write ordering, kept in the cluster state (etcd, or the local
coordinator): which replica is the primary, under which term, and which replicas are in sync.

Every replica runs :class:`ShardRole` on a background thread, every ``tick_s``:

* it stays **registered** as a live member of its shard (a key on its own lease) and listed among
  the shard's replicas;
* with **no live primary claim** — the primary's lease lapsed (it died, hung, or was cut off) —
  the in-sync replicas hold an election: the one with the most writes applied (ties: the lowest
  name) that it can see claims the shard on its lease (only one candidate can: the claim is
  created only where none exists), then a compare-and-swap bumps the term, removes the old
  primary from the in-sync set and names the winner (it fails, and the claim is given back, if
  the record moved since it was read); the winner then establishes its term on the others
  (``PrimaryWriter.establish``). Only an in-sync replica can
  win (it holds every acknowledged write); a shard whose in-sync replicas are all gone waits for
  one to come back rather than lose writes. The first election of a new shard (term 0) is open to
  every replica that registered by then (it waits until all ``replication`` replicas have, or a
  lease period);
* a **primary** keeps its claim alive, steps down the moment the record names another primary or
  a newer term (a paused primary that wakes finds itself replaced: its lease lapsed while it
  slept, and its replicas refuse its term), and brings live replicas outside the in-sync set back
  in (``PrimaryWriter.bring_in``).

Replicas are named by a stable **id** (``--replica-id``, by default the name of the replica's data
dir: ``shard-0-r1``; a pod name in Kubernetes), not by their URL, which can change between runs:
the in-sync set and the shard's membership hold ids, and each live replica registers the URL it
is reached at. ``replication`` is the shard's configured number of replicas, which ``write_ack``
counts against (default: as many as ever registered).

Without a cluster state (``state=None``: one replica in one process, tests) the replica is the
primary of its shard on its own, forever.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from clusterstate.kv import LeaseExpired
from clusterstate.lease import LeaseKeeper
from clusterstate.state import Claim, ClusterState, ShardRecord
from index_shards.peers import PeerClient
from index_shards.primary import PrimaryWriter, RoleView
from index_shards.versions import ShardVersions
from retrieval.contract import RoleInfo
from retrieval.errors import CoordinatorUnavailable, ShardragError

logger = logging.getLogger(__name__)


class ShardRole:
    def __init__(self, versions: ShardVersions, replica: str, state: ClusterState | None, peers: PeerClient, *,
                 url: str | None = None, replication: int = 0, lease_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic, shared_lease: LeaseKeeper | None = None) -> None:
        """``replica``: this replica's stable id; ``url``: where peers reach it (default: the id, as
        in one process; set by :meth:`start` once a server knows its address). ``shared_lease``: a
        started lease this replica's keys hang on instead of its own (a node's replicas share the
        node's: they live and die with one process, and one renewal keeps them all)."""
        self.versions = versions
        self.replica = replica
        self.url = url or replica
        self.replication = replication
        self._urls: dict[str, str] = {replica: self.url}
        self.state = state
        self.peers = peers
        self.lease_s = lease_s
        self.tick_s = min(0.5, lease_s / 4)
        self._clock = clock
        self._record = ShardRecord()
        self._claimed_term = 0  # the term this replica claimed the shard for (0: none)
        self._claim_lease = 0  # the lease the claim hangs on: a new lease holds no claim until it is renewed
        self._lease: LeaseKeeper | None = None
        self._shared_lease = shared_lease
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = clock()
        self._lock = threading.Lock()
        self.writer = PrimaryWriter(versions, self, peers)
        versions.role = self.info
        if state is None:  # the only replica: primary of its own shard
            term = versions.observe_term(max(versions.term, 1))
            self._record = ShardRecord(term, replica, (replica,), (replica,))
            self._claimed_term = term

    @property
    def shard_id(self) -> int:
        return int(self.versions.shard_id)

    # -- what writes see ---------------------------------------------------------------------------
    def view(self) -> RoleView:
        record = self._record
        if self.state is None:
            return RoleView(self.replica, record.term, True, self.replica, record.in_sync, record.replicas,
                            float("inf"), {self.replica: self.url}, self.replication)
        lease = self._lease
        valid = lease.valid_for_s() if lease is not None else 0.0
        is_primary = (record.primary == self.replica and self._claimed_term == record.term
                      and record.term == self.versions.term and lease is not None
                      and lease.lease == self._claim_lease)
        return RoleView(self.replica, record.term, is_primary, record.primary, record.in_sync, record.replicas,
                        valid if is_primary else 0.0, self._urls, self.replication)

    def info(self) -> RoleInfo:
        view = self.view()
        return RoleInfo(self.replica, max(view.term, self.versions.term), view.primary, view.is_primary,
                        view.in_sync, round(view.lease_valid_s, 3) if view.is_primary and self.state else None,
                        self.url)

    def drop_from_in_sync(self, replicas: Sequence[str], term: int) -> bool:
        """Remove ``replicas`` from the in-sync set, only while ``term`` is current. False when it is not."""
        if self.state is None:
            return True
        gone = set(replicas)

        def change(current: ShardRecord) -> ShardRecord | None:
            if current.term != term or current.primary != self.replica:
                return None
            return replace(current, in_sync=tuple(r for r in current.in_sync if r not in gone))

        updated = self.state.update_shard(self.shard_id, change)
        if updated is not None:
            self._record = updated
        return updated is not None

    def add_to_in_sync(self, replica: str, term: int) -> bool:
        if self.state is None:
            return True

        def change(current: ShardRecord) -> ShardRecord | None:
            if current.term != term or current.primary != self.replica:
                return None
            if replica in current.in_sync:
                return current
            return replace(current, in_sync=tuple(sorted({*current.in_sync, replica})))

        updated = self.state.update_shard(self.shard_id, change)
        if updated is not None:
            self._record = updated
        return updated is not None

    # -- the loop ----------------------------------------------------------------------------------
    def start(self, url: str | None = None) -> ShardRole:
        """Start taking part (``url``: where peers and gateways reach this replica, once known)."""
        if url is not None:
            self.url = url
            self._urls = {**self._urls, self.replica: url}
        if self.state is None:
            return self
        self._started = self._clock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"role-{self.shard_id}")
        self._thread.start()
        return self

    def _join(self) -> None:
        """Take a lease and register (retried every tick until the cluster state answers)."""
        assert self.state is not None
        if self._lease is None and self._shared_lease is not None:
            self._shared_lease.subscribe(self._on_new_lease)
            self._lease = self._shared_lease
        elif self._lease is None:
            self._lease = LeaseKeeper(self.state.kv, self.lease_s, name=f"shard-{self.shard_id}:{self.replica}",
                                      on_new_lease=self._on_new_lease).start()
        self._register()
        logger.warning("shard %d: %s registered in %r", self.shard_id, self.replica, self.state)

    def _on_new_lease(self, lease: int) -> None:
        try:
            self._register()
        except CoordinatorUnavailable as exc:
            logger.warning("shard %d: re-registering after a lapsed lease failed: %s", self.shard_id, exc.message)

    def _register(self) -> None:
        assert self.state is not None and self._lease is not None
        self.state.register_member(self.shard_id, self.replica, self._lease.lease, {"url": self.url, "pid": _pid()})

        def change(current: ShardRecord) -> ShardRecord:
            if self.replica in current.replicas:
                return current
            return replace(current, replicas=tuple(sorted({*current.replicas, self.replica})))

        self._record = self.state.update_shard(self.shard_id, change) or self._record

    def _run(self) -> None:
        joined = False
        while not self._stop.is_set():
            try:
                if not joined:
                    self._join()
                    joined = True
                self.tick()
            except CoordinatorUnavailable as exc:
                logger.warning("shard %d: cluster state unavailable: %s", self.shard_id, exc.message)
            except ShardragError as exc:
                logger.warning("shard %d: %s", self.shard_id, exc.message)
            except Exception:  # noqa: BLE001 - the role must keep running
                logger.exception("shard %d: role tick failed", self.shard_id)
            self._stop.wait(self.tick_s)

    def tick(self) -> None:
        """One round: read the record, keep or take the claim, step down, bring replicas in."""
        assert self.state is not None and self._lease is not None
        record, claim, members = self.state.shard_state(self.shard_id)
        self.versions.observe_term(record.term)
        if self.replica not in record.replicas or self.replica not in members:
            self._register()
            record = self._record
        self._urls = {**{r: str(d.get("url") or r) for r, d in members.items()}, self.replica: self.url}
        self._record = record
        if self._claimed_term and (record.term != self._claimed_term or record.primary != self.replica):
            logger.warning("shard %d: stepping down (term %d, primary %s)", self.shard_id, record.term, record.primary)
            # Our claim lives on our lease, and an election starts only while no claim is held: left
            # in place it would keep the shard without a primary for as long as this replica lives
            # (a rival that moved the record on then finds "the claim was taken"). Dropped first, so
            # a failure to drop it is retried next round.
            self.state.drop_claim(self.shard_id, Claim(self.replica, self._claimed_term))
            self._claimed_term = 0
        if self._claimed_term:
            if claim is None:  # our lease lapsed and a new one was taken: claim again under it
                lease = self._lease.lease
                if not self.state.refresh_claim(self.shard_id, Claim(self.replica, record.term), lease):
                    self._claimed_term = 0
                    return
                self._claim_lease = lease
            elif claim != Claim(self.replica, record.term):
                self._claimed_term = 0
                return
            self._bring_in_others(record)
            return
        if claim is None:
            self._elect(record)
        elif claim.replica == self.replica and claim.term > record.term:
            # ours, from a promotion whose record change did not go through: it blocks every election
            self.state.drop_claim(self.shard_id, claim)

    def _progress(self, replica: str) -> tuple[int, int] | None:
        """(writes applied over every version held, the highest term it knows): who has applied
        the most is promoted, under a term above any a candidate knows (a cluster state that was
        lost and started empty must not hand out a term its replicas have seen)."""
        if replica == self.replica:
            info = self.versions.info()
        else:
            url = self._urls.get(replica)
            if url is None:
                return None
            try:
                info = self.peers.info(url, min(1.0, self.lease_s / 2))
            except ShardragError:
                return None
        known = info.role.term if info.role is not None else 0
        return sum(v.applied_seq or 0 for v in info.versions if v.ready), known

    def _elect(self, record: ShardRecord) -> None:
        assert self.state is not None and self._lease is not None
        members = set(self._urls)
        bootstrap = record.term == 0
        if bootstrap:
            everyone = bool(self.replication) and len(members) >= self.replication
            if not everyone and self._clock() - self._started < self.lease_s:
                return  # the first election waits for the shard's replicas to register (a lease period at most)
        eligible = members if bootstrap else members & set(record.in_sync)
        if self.replica not in eligible:
            return
        progress = {r: p for r in sorted(eligible) if (p := self._progress(r)) is not None}
        best = min(progress, key=lambda r: (-progress[r][0], r))
        if best != self.replica:
            return
        term = max(record.term, self.versions.term, *(known for _, known in progress.values())) + 1

        def change(current: ShardRecord) -> ShardRecord | None:
            if current.revision != record.revision:
                return None  # someone else moved first: look again next round
            keep = {r for r in current.in_sync if r != current.primary} if not bootstrap else set()
            return replace(current, term=term, primary=self.replica, in_sync=tuple(sorted(keep | {self.replica})),
                           replicas=tuple(sorted({*current.replicas, self.replica})))

        # The claim first: of two candidates that both saw no claim, only one gets it, and the other
        # changes nothing — neither the record nor the term it knows. (Record first, a loser could
        # move the record to a term with no primary, deposing the winner, or persist a term that
        # never got recorded and refuse the winner's writes until the next failover.)
        lease = self._lease.lease
        claim = Claim(self.replica, term)
        if not self.state.put_claim(self.shard_id, claim, lease):
            return  # someone else claimed first: look again next round
        try:
            self.versions.observe_term(term)  # persisted before it is recorded: never act under a term that may be lost
            updated = self.state.update_shard(self.shard_id, change)
        except BaseException:
            self._drop_stray_claim(claim)
            raise
        if updated is None:  # the record moved since it was read: give the claim back, look again
            self._drop_stray_claim(claim)
            return
        self._record, self._claimed_term, self._claim_lease = updated, term, lease
        logger.warning("shard %d: promoted to primary, term %d (in sync: %s)", self.shard_id, term,
                       ", ".join(updated.in_sync))
        self.writer.establish()

    def _drop_stray_claim(self, claim: Claim) -> None:
        """Give back a claim whose promotion did not go through (a failure here is retried by
        :meth:`tick`, which drops a claim of ours that no promotion backs)."""
        assert self.state is not None
        with contextlib.suppress(CoordinatorUnavailable, LeaseExpired):
            self.state.drop_claim(self.shard_id, claim)

    def _bring_in_others(self, record: ShardRecord) -> None:
        assert self.state is not None
        for replica in sorted(set(self._urls) - set(record.in_sync) - {self.replica}):
            try:
                self.writer.bring_in(replica, self._urls[replica])
            except ShardragError as exc:
                logger.info("shard %d: bringing %s in: %s", self.shard_id, replica, exc.message)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._lease is not None:
            if self._claimed_term and self.state is not None:
                try:
                    self.state.drop_claim(self.shard_id, Claim(self.replica, self._claimed_term))
                except (CoordinatorUnavailable, LeaseExpired):
                    pass
            if self._lease is self._shared_lease:  # the lease lives on: take this replica's keys off it
                self._lease.unsubscribe(self._on_new_lease)
                if self.state is not None:
                    with contextlib.suppress(CoordinatorUnavailable):
                        self.state.unregister_member(self.shard_id, self.replica)
            else:
                self._lease.stop()
        self.writer.close()


def _pid() -> int:
    import os

    return os.getpid()
