"""The primary-term protocol on real version stores (FAISS, WALs on disk) and a real local
coordinator, replicas in one process talking through the peer seam: a replica refuses an old
term, other content at a seq it holds and a batch after a record that is not the sender's; a
primary drops a replica that did not take a write from the in-sync set before it acknowledges;
one idempotency key applies once however many requests carry it at the same time; a lagging
replica is caught up from the log, a diverged one restored from a snapshot; when the primary's
lease lapses the in-sync replica with the most writes is promoted under a new term."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest

from clusterstate.local import LocalKV
from clusterstate.state import Claim, ClusterState
from index_shards import snapshots
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.peers import LocalPeers
from index_shards.replica_log import Mark
from index_shards.role import ShardRole
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.writes import accept
from retrieval.contract import SearchParams, WriteReply
from retrieval.errors import (
    Diverged,
    InvalidRequest,
    NotPrimary,
    ReplicaBehind,
    ShardUnavailable,
    StaleTerm,
    VersionConflict,
)
from retrieval.records import NOOP, UPSERT, WalRecord
from tests.conftest import random_corpus

DIM = 8


def record(doc_id: str, seed: int, *, key: str = "", fingerprint: str = "") -> WalRecord:
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return WalRecord(0, UPSERT, doc_id, "t", f"text {seed}", {"n": seed}, vector / np.linalg.norm(vector), key=key,
                     fingerprint=fingerprint)


@pytest.fixture()
def shard_dir_built(tmp_path):
    documents, vectors, version = random_corpus(n=50, dim=DIM)
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("c", 1), show_progress=False)
    return shard_dir(resolve_version(tmp_path / "root", "c")[0], 0), version.id


class Cluster:
    """Three replicas of one shard in this process, coordinating through one local coordinator
    file. ``cut`` makes a replica unreachable for the others (its peer calls fail), as a
    partition would."""

    def __init__(self, tmp_path, directory, *, lease_s: float = 2.0) -> None:
        self.names = ["r0", "r1", "r2"]
        self.cut: set[str] = set()
        self.kv = LocalKV(tmp_path / "cluster-state.json")
        self.peers = _CuttablePeers(self.cut)
        self.roles: dict[str, ShardRole] = {}
        for name in self.names:
            versions = ShardVersions(Shard.load(directory, device="cpu"), data_dir=tmp_path / name)
            self.peers.replicas[name] = versions
            self.roles[name] = ShardRole(versions, name, ClusterState(self.kv, "c"), self.peers, lease_s=lease_s)
        for role in self.roles.values():
            role.start()

    def primary(self, timeout_s: float = 20.0) -> ShardRole:
        deadline = time.monotonic() + timeout_s
        while True:
            found = [r for r in self.roles.values() if r.view().is_primary and r.replica not in self.cut]
            if found:
                return found[0]
            assert time.monotonic() < deadline, "no primary was elected"
            time.sleep(0.05)

    def all_in_sync(self, timeout_s: float = 20.0) -> ShardRole:
        """The primary, once every replica has been brought into the in-sync set."""
        primary = self.primary(timeout_s)
        deadline = time.monotonic() + timeout_s
        while set(primary.view().in_sync) != set(self.names):
            assert time.monotonic() < deadline, primary.view()
            time.sleep(0.05)
        return primary

    def stop(self) -> None:
        for role in self.roles.values():
            role.stop()
            role.versions.close()


class _CuttablePeers(LocalPeers):
    def __init__(self, cut: set[str]) -> None:
        super().__init__()
        self.cut = cut

    def _of(self, peer: str) -> ShardVersions:
        if peer in self.cut:
            raise ShardUnavailable(f"{peer} is cut off")
        return super()._of(peer)


@pytest.fixture()
def cluster(tmp_path, shard_dir_built):
    directory, _ = shard_dir_built
    running = Cluster(tmp_path, directory)
    yield running
    running.stop()


def test_a_replica_refuses_an_old_term_other_content_and_a_foreign_prev(tmp_path, shard_dir_built):
    directory, version = shard_dir_built
    replica = ShardVersions(Shard.load(directory, device="cpu"), data_dir=tmp_path / "r")
    first = [record("a", 1).sequenced(1, 2), record("b", 2).sequenced(2, 2)]
    assert accept(replica, version, 2, None, first) == 2 and replica.term == 2
    assert accept(replica, version, 2, None, first) == 2  # the same records again: a retry, nothing applied
    with pytest.raises(StaleTerm, match="term 1"):
        accept(replica, version, 1, None, [record("c", 3).sequenced(3, 1)])
    with pytest.raises(Diverged, match="seq 2"):  # seq 2 from another primary, with other content
        accept(replica, version, 3, None, [record("x", 9).sequenced(2, 3)])
    foreign = Mark(2, 3, record("x", 9).sequenced(2, 3).checksum)
    with pytest.raises(Diverged, match="went another way"):
        accept(replica, version, 3, foreign, [record("c", 3).sequenced(3, 3)])
    own = replica.slot(version).log.mark(2)
    assert accept(replica, version, 3, own, [record("c", 3).sequenced(3, 3)]) == 3
    replica.close()
    again = ShardVersions(Shard.load(directory, device="cpu"), data_dir=tmp_path / "r")
    assert again.term == 3  # the term a replica knows is on disk: a restart still refuses the old primary
    with pytest.raises(StaleTerm):
        accept(again, version, 2, None, [record("d", 4).sequenced(4, 2)])
    again.close()


def test_writes_replicate_and_a_replica_that_misses_one_leaves_the_in_sync_set_first(cluster, shard_dir_built):
    _, version = shard_dir_built
    primary = cluster.primary()
    assert primary.view().term == 1 and set(primary.view().in_sync) == {primary.replica}  # bootstrap: itself
    others = [n for n in cluster.names if n != primary.replica]
    deadline = time.monotonic() + 20
    while set(primary.view().in_sync) != set(cluster.names):  # the others are brought in
        assert time.monotonic() < deadline, primary.view()
        time.sleep(0.05)
    reply = primary.writer.write(version, [record("a", 1), record("b", 2)], "all", 0)
    assert isinstance(reply, WriteReply) and (reply.first_seq, reply.copies) == (2, 3)  # seq 1: the term's no-op
    assert all(cluster.roles[n].versions.get(version).get("b") is not None for n in others)

    cluster.cut.add(others[0])  # it stops answering: the next write drops it, then is acknowledged
    reply = primary.writer.write(version, [record("c", 3)], "majority", 0)
    assert reply.copies == 2 and others[0] not in primary.view().in_sync
    assert others[0] not in ClusterState(cluster.kv, "c").shard(0).in_sync  # recorded before the ack
    with pytest.raises(ShardUnavailable, match="durable on 2 of the 3"):
        primary.writer.write(version, [record("d", 4)], "all", 0)
    cluster.cut.clear()
    deadline = time.monotonic() + 20
    while others[0] not in primary.view().in_sync:  # caught up from the primary's log and back in
        assert time.monotonic() < deadline
        time.sleep(0.05)
    back = cluster.roles[others[0]].versions.get(version)
    assert back.get("c") is not None and back.get("d") is not None
    with pytest.raises(NotPrimary):
        cluster.roles[others[1]].writer.write(version, [record("e", 5)], "one", 0)


def test_one_idempotency_key_applies_once_however_many_send_it_at_once(cluster, shard_dir_built):
    """Issue 33, item 6: two concurrent requests with the same key were both applied (the gateway
    checked its reply table before writing and recorded after)."""
    _, version = shard_dir_built
    primary = cluster.all_in_sync()
    batch = [record("k1", 1, key="retry-me", fingerprint="f" * 64), record("k2", 2, key="retry-me",
                                                                         fingerprint="f" * 64)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: primary.writer.write(version, batch, "majority", 0), range(8)))
    assert len({(r.first_seq, r.last_seq) for r in replies}) == 1  # one write; seven answered from it
    assert sum(not r.duplicate for r in replies) == 1 and all(r.doc_ids == ("k1", "k2") for r in replies if
                                                              r.duplicate)
    live = primary.versions.get(version)
    assert live.applied_seq == replies[0].last_seq  # nothing applied after it
    with pytest.raises(VersionConflict, match="different request"):
        primary.writer.write(version, [record("k1", 9, key="retry-me", fingerprint="0" * 64)], "majority", 0)


def test_a_diverged_replica_is_restored_from_a_snapshot(cluster, shard_dir_built):
    _, version = shard_dir_built
    primary = cluster.all_in_sync()
    primary.writer.write(version, [record("a", 1)], "all", 0)
    victim = next(r for n, r in cluster.roles.items() if n != primary.replica)
    cluster.cut.add(victim.replica)
    primary.writer.write(version, [record("b", 2)], "majority", 0)  # the victim leaves the in-sync set
    # the victim writes a record of its own at the next seq (as a deposed primary's unacknowledged write would)
    slot = victim.versions.slot(version)
    stale = WalRecord(slot.live.applied_seq + 1, NOOP, "", term=victim.versions.term)
    with slot.write_lock:
        from index_shards.writes import append_locked

        append_locked(victim.versions, slot, [stale])
    cluster.cut.clear()
    deadline = time.monotonic() + 30
    while victim.replica not in primary.view().in_sync:
        assert time.monotonic() < deadline, primary.view()
        time.sleep(0.05)
    mine = primary.versions.get(version).digest()
    theirs = victim.versions.get(version).digest()
    assert (mine["sha256"], mine["applied_seq"]) == (theirs["sha256"], theirs["applied_seq"])
    assert victim.versions.slot(version).log.mark(stale.seq).checksum != stale.checksum  # its own record is gone


def test_when_the_primary_is_gone_the_in_sync_replica_with_most_writes_takes_over(cluster, shard_dir_built):
    _, version = shard_dir_built
    first = cluster.all_in_sync()
    first.writer.write(version, [record("a", 1)], "all", 0)
    term = first.view().term
    cluster.cut.add(first.replica)
    first.stop()  # its lease lapses: nobody renews it
    second = cluster.primary(timeout_s=30)
    assert second.replica != first.replica and second.view().term == term + 1
    assert first.replica not in second.view().in_sync  # the old primary must catch up before it counts again
    reply = second.writer.write(version, [record("b", 2)], "majority", 0)
    assert reply.term == term + 1
    with pytest.raises(StaleTerm):  # a replica refuses the old primary's term from now on
        accept(cluster.roles[next(n for n in cluster.names if n not in (first.replica, second.replica))].versions,
               version, term, None, [record("z", 9).sequenced(reply.last_seq + 1, term)])


def test_a_snapshot_restore_from_an_old_term_is_refused(cluster, shard_dir_built):
    _, version = shard_dir_built
    primary = cluster.primary()
    replica = next(r for n, r in cluster.roles.items() if n != primary.replica)
    replica.versions.observe_term(5)
    snapshot = snapshots.take(primary.versions, version)
    with pytest.raises(StaleTerm):
        snapshots.restore_from(replica.versions, version, 4, snapshot, force=True)


def test_concurrent_writers_never_interleave_a_batch(cluster, shard_dir_built):
    _, version = shard_dir_built
    primary = cluster.all_in_sync()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(10):
                primary.writer.write(version, [record(f"w{n}-{i}-{j}", i) for j in range(3)], "one", 0)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    records = list(primary.versions.slot(version).log.records_after(0))
    batches = [r.doc_id.rsplit("-", 1)[0] for r in records if r.op == UPSERT]
    assert all(batches[i] == batches[i + 1] == batches[i + 2] for i in range(0, len(batches), 3))


def test_a_primary_whose_record_moved_on_drops_its_claim_so_the_shard_elects_again(cluster):
    """The race the across-hosts nemesis found: a replica promotes itself in the shard record while
    the old primary renews its claim (its lease had lapsed and came back), so the claim stays the
    old primary's. The old primary steps down on the record — and must drop its claim too, or no
    election starts (one runs only while no claim is held) for as long as it lives."""
    old = cluster.all_in_sync()
    state = ClusterState(cluster.kv, "c")
    rival = next(name for name in cluster.names if name != old.replica)

    def promote_rival(current):
        return replace(current, term=current.term + 1, primary=rival)

    moved = state.update_shard(0, promote_rival)
    assert moved is not None and state.shard_state(0)[1] is not None  # the old claim is still there
    deadline = time.monotonic() + 15
    while True:
        primaries = [r for r in cluster.roles.values() if r.view().is_primary]
        if primaries and primaries[0].view().term > moved.term:
            break
        assert time.monotonic() < deadline, ("no primary after the record moved on", state.shard_state(0))
        time.sleep(0.05)
    assert not old.view().is_primary or old.view().term > moved.term


def test_a_candidate_that_loses_the_claim_changes_neither_the_record_nor_its_term(tmp_path, shard_dir_built):
    """The across-hosts nemesis found this race: two replicas saw no claim; the winner had recorded
    its term and not yet claimed, the loser read that record, recorded the next term naming itself,
    then lost the claim: the record named a primary without a claim (the winner stepped down), and
    the in-sync set lost both. The claim now comes first, so the loser stops at it."""
    directory, _ = shard_dir_built
    state = ClusterState(LocalKV(tmp_path / "state.json"), "c")
    peers = LocalPeers()
    roles = {}
    for name in ("r0", "r1"):
        peers.replicas[name] = ShardVersions(Shard.load(directory, device="cpu"), data_dir=tmp_path / name)
        roles[name] = ShardRole(peers.replicas[name], name, state, peers, replication=2, lease_s=2.0)
    try:
        for role in roles.values():
            role._join()
        before = state.shard(0)
        assert before.term == 0 and state.claim(0) is None
        # r1 has claimed (the first step of its promotion) when r0, which read no claim, elects
        assert state.put_claim(0, Claim("r1", 1), roles["r1"]._lease.lease)
        roles["r0"]._elect(before)
        assert state.shard(0) == before and roles["r0"].versions.term == 0 and not roles["r0"].view().is_primary
        # r1's record change fails too (the record moved), so it gives its claim back ...
        state.update_shard(0, lambda current: replace(current, replicas=(*current.replicas, "r9")))  # moved
        state.drop_claim(0, Claim("r1", 1))
        roles["r1"]._elect(before)
        assert state.claim(0) is None and state.shard(0).term == 0
        # ... and a claim of its own that no promotion backs (the give-back failed) goes at its next tick
        assert state.put_claim(0, Claim("r1", 1), roles["r1"]._lease.lease)
        roles["r1"].tick()
        assert state.claim(0) is None
    finally:
        for role in roles.values():
            role.stop()
            role.versions.close()


def test_a_replica_whose_log_diverged_past_a_write_never_answers_a_session_read_for_it(tmp_path, shard_dir_built):
    """The nemesis across hosts found this: a deposed primary holds records of its old term that
    were never acknowledged, up to a seq past the new primary's acknowledged write. Its seq says
    it has the write; the term of its record at that seq says it does not."""
    directory, version = shard_dir_built
    deposed = ShardVersions(Shard.load(directory, device="cpu"), data_dir=tmp_path / "deposed")
    successor = ShardVersions(Shard.load(directory, device="cpu"), data_dir=tmp_path / "successor")
    shared = [record("a", 1).sequenced(1, 2), record("b", 2).sequenced(2, 2)]  # acknowledged under term 2
    for replica in (deposed, successor):
        assert accept(replica, version, 2, None, shared) == 2
    # the old primary's unacknowledged records, seqs 3..6 of term 2
    assert accept(deposed, version, 2, deposed.slot(version).log.mark(2),
                  [record(f"lost{i}", 10 + i).sequenced(3 + i, 2) for i in range(4)]) == 6
    # the new primary of term 3: its no-op at seq 3, then the acknowledged write at seq 4
    assert accept(successor, version, 3, successor.slot(version).log.mark(2),
                  [WalRecord(3, NOOP, "", term=3), record("mine", 99).sequenced(4, 3)]) == 4
    mine = record("mine", 99).vector[None, :]
    params = SearchParams(k=1, version=version, with_text=False, min_seq=4, min_term=3)
    with pytest.raises(ReplicaBehind) as behind:
        deposed.search(mine, params)
    assert behind.value.field == "min_term" and "term 2" in behind.value.message
    # by the seq alone (a client that sent no min_term) the deposed replica answers, without the write
    alone = deposed.search(mine, replace(params, min_term=None)).results
    assert "mine" not in alone[0]["doc_ids"]
    assert successor.search(mine, params).results[0]["doc_ids"][0] == "mine"
    assert ShardVersions.applied_term(successor.slot(version)) == 3
    for replica in (deposed, successor):
        replica.close()


def test_session_floors_travel_in_the_query_string_both_ways():
    params = SearchParams(k=5, version="v", min_seq=42, min_term=3)
    assert SearchParams.from_query_string(params.query_string(), 100) == params
    with pytest.raises(InvalidRequest) as bad:
        SearchParams.from_query_string("k=5&min_term=-1", 100)
    assert bad.value.field == "min_term"
