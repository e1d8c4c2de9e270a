"""Hosts on one machine: each a Linux network namespace with its own address on a bridge, and the
links between them cut and healed on purpose (partitions for the nemesis, ``serving.local.nemesis``).

    with Network() as net:                      # root + iproute2; see unavailable_reason()
        a, b = net.add_host("shard-0-r0"), net.add_host("etcd-0")
        subprocess.Popen([*a.prefix, "python", "-m", "index_shards", "serve", "--host", a.address, ...])
        net.block(a, b)                         # a's packets to b are dropped (one way)
        net.partition([a], [b])                 # both ways
        net.heal()

Layout: one bridge in the root namespace holding ``10.X.Y.1/24`` (so this process — the test's
clients — reaches every host), and per host a namespace ``srl-<tag>-<name>`` whose ``eth0`` (one end
of a veth pair, the other on the bridge) holds ``10.X.Y.N``. The subnet is one no interface or
route here uses; traffic goes only to addresses made here.

Cuts need no netem (this kernel has none): a route to B inside A's namespace via a "sink" — an
address no host holds, pinned to a MAC no host has — makes what A sends to B vanish on the bridge
without an error (a cut cable: A's connects and requests time out); ``reject`` uses a ``prohibit``
route instead (A gets an error at once). Reverse-path filtering is off in each namespace, so a
route there affects only what that host *sends*. ``link_down`` takes a
host's interface down (cut from everyone, the test's clients included).

Everything is removed by :meth:`Network.close` (also on an exception or Ctrl-C, as a context
manager, and at exit); what a SIGKILLed owner left behind is swept by the next Network, which
recognises it by the dead owner's pid in the names.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from retrieval.errors import ShardragError

logger = logging.getLogger(__name__)

IP = shutil.which("ip") or "/usr/sbin/ip"
PREFIX = "srl-"  # namespaces: srl-<tag>-<host name>
SINK_MAC = "02:00:5e:00:53:fe"  # locally administered; no interface here has it
LINK = "srv"  # veth ends on the bridge: srv<tag><index>; the bridge: srb<tag>
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
_counter = 0
_counter_lock = threading.Lock()


class NetworkError(ShardragError):
    code = "network_error"


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, rest = divmod(number, 36)
        digits = _ALPHABET[rest] + digits
        if number == 0:
            return digits


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def unavailable_reason() -> str | None:
    """Why namespaced hosts cannot be made here (None: they can): not root, no iproute2, or a
    kernel/container that refuses network namespaces."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root, as .ci/run does"
    if not os.access(IP, os.X_OK):
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"this machine refuses network namespaces: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    netns: str
    address: str
    link: str  # the veth end on the bridge (root namespace)

    @property
    def prefix(self) -> list[str]:
        """Put before a command line to run it on this host."""
        return [IP, "netns", "exec", self.netns]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix, *argv], capture_output=True, text=True, timeout=30)


def _owner_alive(tag: str) -> bool:
    try:
        pid = int(tag[:-1], 36)
    except ValueError:
        return True  # not ours to judge
    return os.path.exists(f"/proc/{pid}")


def sweep_stale() -> int:
    """Remove the namespaces and links of Networks whose owner process is gone; how many."""
    removed = 0
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX) and name.count("-") >= 2 and not _owner_alive(name.split("-")[1]):
            removed += _ip("netns", "del", name, check=False).returncode == 0
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith("srb") and not _owner_alive(name[3:]):
            removed += _ip("link", "del", name, check=False).returncode == 0
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    used = _ip("-o", "-4", "addr", "show", check=False).stdout + _ip("-4", "route", "show", "table", "all",
                                                                       check=False).stdout
    rng = random.Random()
    for _ in range(200):
        a, b = rng.randrange(100, 250), rng.randrange(1, 255)
        if f"10.{a}.{b}." not in used:
            return ipaddress.IPv4Network(f"10.{a}.{b}.0/24")
    raise NetworkError("no free 10.x.y.0/24 subnet for the test network")


class Network:
    """A bridge and the hosts on it (module docstring)."""

    def __init__(self, *, max_hosts: int = 250) -> None:
        global _counter
        reason = unavailable_reason()
        if reason:
            raise NetworkError(reason)
        sweep_stale()
        with _counter_lock:
            _counter += 1
            self.tag = _base36(os.getpid()) + _ALPHABET[_counter % 36]
        self.subnet = _free_subnet()
        self.bridge = f"srb{self.tag}"
        self.gateway_address = str(self.subnet.network_address + 1)
        self.sink = str(self.subnet.network_address + 254)  # no host holds it (hosts hold .2 to .250)
        self.hosts: dict[str, Host] = {}
        self.max_hosts = max_hosts
        self._blocked: set[tuple[str, str, str]] = set()  # (from host, to address, route type)
        self._down: set[str] = set()
        self._closed = False
        self._lock = threading.Lock()
        _ip("link", "add", self.bridge, "type", "bridge")
        atexit.register(self.close)
        _ip("addr", "add", f"{self.gateway_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        """A new namespace with its own address; ``name`` (letters, digits, '-') names it."""
        if name in self.hosts:
            raise NetworkError(f"host {name!r} exists")
        if not name.replace("-", "").isalnum():
            raise NetworkError(f"host name {name!r}: letters, digits and '-' only")
        index = len(self.hosts) + 2
        if index > self.max_hosts:
            raise NetworkError(f"at most {self.max_hosts} hosts")
        host = Host(name, f"{PREFIX}{self.tag}-{name}", str(self.subnet.network_address + index),
                    f"{LINK}{self.tag}{_base36(index)}")
        _ip("netns", "add", host.netns)
        self.hosts[name] = host
        _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("link", "set", host.link, "master", self.bridge, "up")
        for key in ("all", "default", "eth0"):  # a route there must not filter what arrives (module doc)
            _ip("netns", "exec", host.netns, "sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=0")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", host.netns, "neigh", "replace", self.sink, "lladdr", SINK_MAC, "dev", "eth0", "nud", "permanent")
        return host

    def host(self, name: str) -> Host:
        return self.hosts[name]

    # -- cuts ----------------------------------------------------------------------------------
    def block(self, source: Host, target: Host | str, *, reject: bool = False) -> None:
        """Lose what ``source`` sends to ``target`` (a host, or this machine's own address on the
        bridge: ``network.gateway_address``); ``reject``: answer it with an error instead."""
        address = target if isinstance(target, str) else target.address
        kind = "reject" if reject else "drop"
        with self._lock:
            if any(k[0] == source.name and k[1] == address for k in self._blocked):
                return
            route = ["prohibit", f"{address}/32"] if reject else [f"{address}/32", "via", self.sink, "dev", "eth0"]
            _ip("-n", source.netns, "route", "add", *route)
            self._blocked.add((source.name, address, kind))

    def unblock(self, source: Host, target: Host | str) -> None:
        address = target if isinstance(target, str) else target.address
        with self._lock:
            for key in [k for k in self._blocked if k[0] == source.name and k[1] == address]:
                _ip("-n", source.netns, "route", "del", f"{address}/32", check=False)
                self._blocked.discard(key)

    def partition(self, side: Iterable[Host], other: Iterable[Host], *, one_way: bool = False) -> None:
        """Cut ``side`` from ``other``: both ways, or (``one_way``) only what ``other`` sends to
        ``side`` — the side can still send but receives nothing."""
        side, other = list(side), list(other)
        for a in side:
            for b in other:
                self.block(b, a)
                if not one_way:
                    self.block(a, b)

    def link_down(self, host: Host) -> None:
        with self._lock:
            _ip("-n", host.netns, "link", "set", "eth0", "down")
            self._down.add(host.name)

    def link_up(self, host: Host) -> None:
        with self._lock:
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            self._down.discard(host.name)

    def heal(self) -> None:
        """Every cut made so far undone."""
        for source, address, _kind in list(self._blocked):
            self.unblock(self.hosts[source], address)
        for name in list(self._down):
            self.link_up(self.hosts[name])

    @property
    def cuts(self) -> list[str]:
        names = {h.address: h.name for h in self.hosts.values()}
        return sorted([f"{s} -x-> {names.get(a, a)} ({k})" for s, a, k in self._blocked] +
                      [f"{n} link down" for n in self._down])

    # -- end -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Remove every namespace and link this Network made (idempotent). Processes still running
        in a namespace keep it alive until they exit: stop them first."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for host in self.hosts.values():
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.link, check=False)
        _ip("link", "del", self.bridge, check=False)
        atexit.unregister(self.close)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
