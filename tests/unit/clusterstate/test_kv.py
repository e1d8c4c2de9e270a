"""The KV seam on both stores it has — a real etcd server and the local coordinator's file — with
the same tests: compare-and-swap, prefixes, leases that lapse and take their keys along."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from clusterstate import open_coordinator
from clusterstate.etcd import EtcdKV
from clusterstate.kv import KV, LeaseExpired
from clusterstate.local import LocalKV
from retrieval.errors import ConfigError, CoordinatorUnavailable
from tests.helpers.etcd import EtcdCluster, free_port, free_ports


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    with EtcdCluster(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


@pytest.fixture(params=["etcd", "local"])
def kv(request, tmp_path) -> KV:
    if request.param == "etcd":
        store: KV = EtcdKV(request.getfixturevalue("etcd").client_urls)
    else:
        store = LocalKV(tmp_path / "state.json")
    yield store
    store.close()


def test_compare_and_swap_on_revisions(kv: KV):
    key = f"/t/{uuid.uuid4().hex}/a"
    assert kv.get(key) is None
    first = kv.put(key, b"one", expect_revision=0)
    assert first is not None and kv.get(key).value == b"one" and kv.get(key).mod_revision == first
    assert kv.put(key, b"again", expect_revision=0) is None  # not absent any more
    assert kv.put(key, b"stale", expect_revision=first - 1) is None
    second = kv.put(key, b"two", expect_revision=first)
    assert second is not None and second > first and kv.get(key).value == b"two"
    assert not kv.delete(key, expect_revision=first)
    assert kv.delete(key, expect_revision=second) and kv.get(key) is None
    assert kv.revision() >= second


def test_prefixes_are_ordered_and_bounded(kv: KV):
    root = f"/t/{uuid.uuid4().hex}/"
    for name in ("b", "a", "c/d"):
        kv.put(root + name, name.encode())
    kv.put(root[:-1] + "x", b"outside")  # shares the prefix without the slash
    assert [e.key[len(root):] for e in kv.prefix(root)] == ["a", "b", "c/d"]


def test_a_lapsed_lease_takes_its_keys_and_cannot_be_renewed(kv: KV):
    key = f"/t/{uuid.uuid4().hex}/leased"
    lease = kv.grant(1)
    kv.put(key, b"alive", lease=lease)
    assert kv.get(key).lease == lease and kv.keepalive(lease) >= 1
    revision = kv.revision()
    deadline = time.monotonic() + 10
    while kv.get(key) is not None:
        assert time.monotonic() < deadline, "the lease never lapsed"
        time.sleep(0.2)
    assert kv.revision() > revision  # a watcher polling the revision sees the key go
    with pytest.raises(LeaseExpired):
        kv.keepalive(lease)
    with pytest.raises(LeaseExpired):  # nor can a key be put on it (it would never expire, or vanish at once)
        kv.put(key, b"late", lease=lease)
    assert kv.get(key) is None
    revoked = kv.grant(5)
    kv.put(key, b"again", lease=revoked)
    kv.revoke(revoked)
    assert kv.get(key) is None
    kv.revoke(revoked)  # twice is no error


def test_an_unreachable_etcd_is_a_coordinator_error_naming_it():
    kv = EtcdKV([f"http://127.0.0.1:{free_port()}"], timeout_s=0.5, retry_s=0.5)
    with pytest.raises(CoordinatorUnavailable, match="no etcd member answered"):
        kv.get("/x")


def test_one_dead_member_of_three_is_passed_over(tmp_path):
    with EtcdCluster(tmp_path, members=3) as cluster:
        kv = EtcdKV(cluster.client_urls, timeout_s=1.0)
        assert kv.put("/t/k", b"v") is not None
        cluster.members[0].kill()
        assert kv.get("/t/k").value == b"v" and kv.put("/t/k", b"w") is not None


def test_ports_picked_together_are_distinct():
    # one at a time the kernel handed one port out twice: two members on one peer port, no cluster
    ports = free_ports(64)
    assert len(set(ports)) == 64


def test_a_member_whose_port_was_taken_starts_again_on_fresh_ports(tmp_path):
    """A port chosen free can be taken before etcd binds it (another test's process): the member
    exits, and the cluster starts again on new ports instead of reporting itself healthy."""
    cluster = EtcdCluster(tmp_path, members=3)
    taken = int(cluster.members[1].peer_url.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with cluster:
            assert all(member.alive for member in cluster.members)
            assert all(not member.peer_url.endswith(f":{taken}") for member in cluster.members)
            kv = EtcdKV(cluster.client_urls, timeout_s=1.0)
            assert kv.put("/t/k", b"v") is not None and kv.get("/t/k").value == b"v"
    assert "address already in use" in (tmp_path / "etcd" / "m1.log").read_text()


def test_a_start_that_cannot_succeed_says_which_member_exited(tmp_path):
    cluster = EtcdCluster(tmp_path, members=1)
    taken = int(cluster.members[0].client_url.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with pytest.raises(RuntimeError, match="etcd member m0 exited while the cluster started"):
            cluster.start(attempts=1)
    assert not any(member.alive for member in cluster.members)


def test_coordinator_specs(tmp_path):
    assert isinstance(open_coordinator(None, local_path=tmp_path / "s.json"), LocalKV)
    assert isinstance(open_coordinator(f"file://{tmp_path}/s.json"), LocalKV)
    etcd = open_coordinator("etcd://10.0.0.1:2379,10.0.0.2:2379")
    assert isinstance(etcd, EtcdKV) and etcd.endpoints == ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    for bad in ("etcd://", "etcd://nohost", "zk://a:1"):
        with pytest.raises(ConfigError, match="coordinator"):
            open_coordinator(bad)
    with pytest.raises(ConfigError):
        open_coordinator(None)


def _count_up(path: str, writer: int, times: int) -> None:
    store = LocalKV(path)
    for number in range(times):
        store.put(f"/w/{writer}", str(number).encode())


def test_local_reads_take_no_lock_yet_see_whole_states_in_order(tmp_path):
    """Readers of the local coordinator do not take its lock (many replicas poll it every tick):
    while two other processes write, every read is a whole state — parsed, each writer's value a
    number it wrote — and what a reader sees never goes back (revisions and values only grow)."""
    import multiprocessing

    path = str(tmp_path / "state.json")
    reader = LocalKV(path)
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_count_up, args=(path, w, 150)) for w in range(2)]
    for process in writers:
        process.start()
    seen_revision, seen = 0, {0: -1, 1: -1}
    reads = 0
    while any(p.is_alive() for p in writers) or reads == 0:
        revision = reader.revision()
        entries = {int(e.key.rsplit("/", 1)[1]): int(e.value) for e in reader.prefix("/w/")}
        assert revision >= seen_revision
        for writer, value in entries.items():
            assert value >= seen[writer]
            seen[writer] = value
        seen_revision, reads = revision, reads + 1
    for process in writers:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert {int(e.value) for e in reader.prefix("/w/")} == {149} and reads > 10
