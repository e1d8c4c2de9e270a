"""A real etcd cluster for tests, benchmarks and the namespaced lab: 1 or 3 members on 127.0.0.1
(free ports) or each on a host of its own (``serving.local.netns``), data in a directory.

The binary is Debian's ``etcd-server`` (``scripts/install-system-deps.sh`` installs it; the
README's test command runs that script). Members can be SIGKILLed, paused and restarted on their
old ports and data, as the chaos tests and the nemesis need.

    with EtcdCluster(tmp_path, members=3) as etcd:
        kv = EtcdKV(etcd.client_urls)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from retrieval.errors import ConfigError
from serving.local.netns import Host

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
MISSING = ("etcd is not installed: run `bash scripts/install-system-deps.sh` (Debian's etcd-server), "
           "as the README's test command does")


def etcd_available() -> bool:
    return os.access(ETCD, os.X_OK)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now. Every socket stays bound until all are, so
    the kernel cannot hand one port out twice — one at a time it did, and two members given the
    same peer port made all three refuse to start."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


class EtcdMember:
    def __init__(self, name: str, directory: Path, client_port: int, peer_port: int, initial_cluster: str,
                 host: Host | None = None) -> None:
        self.name = name
        self.directory = directory
        address = host.address if host else "127.0.0.1"
        self.client_url = f"http://{address}:{client_port}"
        self.peer_url = f"http://{address}:{peer_port}"
        self.initial_cluster = initial_cluster
        self.host = host
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / f"{name}.log"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [ETCD, "--name", self.name, "--data-dir", str(self.directory / f"{self.name}.data"),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", self.initial_cluster, "--initial-cluster-token", "shardrag-test",
                "--initial-cluster-state", "new", "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--log-level", "warn"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([*(self.host.prefix if self.host else []), *argv], stdout=log,
                                            stderr=subprocess.STDOUT)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class EtcdCluster:
    def __init__(self, directory: Path, members: int = 1, hosts: list[Host] | None = None) -> None:
        """``hosts``: one per member, each member on its own (etcd's usual ports 2379/2380 there)."""
        if not etcd_available():
            raise ConfigError(MISSING, field="coordinator")
        if hosts is not None and len(hosts) != members:
            raise ConfigError(f"{members} etcd members need {members} hosts, not {len(hosts)}", field="hosts")
        self.directory = Path(directory) / "etcd"
        self.hosts = hosts
        self.members = self._members(members)

    def _members(self, count: int) -> list[EtcdMember]:
        hosts = self.hosts
        if hosts:
            ports = [(2379, 2380)] * count
        else:
            picked = free_ports(2 * count)
            ports = [(picked[2 * i], picked[2 * i + 1]) for i in range(count)]
        addresses = [h.address for h in hosts] if hosts else ["127.0.0.1"] * count
        initial = ",".join(f"m{i}=http://{addresses[i]}:{peer}" for i, (_, peer) in enumerate(ports))
        return [EtcdMember(f"m{i}", self.directory, client, peer, initial, hosts[i] if hosts else None)
                for i, (client, peer) in enumerate(ports)]

    @property
    def client_urls(self) -> list[str]:
        return [m.client_url for m in self.members]

    @property
    def spec(self) -> str:
        """The ``--coordinator`` value naming every member."""
        return "etcd://" + ",".join(url[len("http://"):] for url in self.client_urls)

    def start(self, timeout_s: float = 30.0, attempts: int = 3) -> EtcdCluster:
        """Start every member of a new cluster and wait until each answers. On 127.0.0.1 a port
        chosen free can be taken before etcd binds it (another test's process): a member that
        exits while the cluster starts means fresh ports and a fresh start, up to ``attempts``."""
        for attempt in range(1, max(attempts, 1) + 1):
            for member in self.members:
                member.start()
            try:
                self.wait_healthy(timeout_s, every_member=True)
                return self
            except RuntimeError:
                exited = not all(member.alive for member in self.members)
                self.stop()
                if self.hosts is not None or attempt == attempts or not exited:
                    raise
            for member in self.members:  # a new cluster: nothing of the failed start is kept
                shutil.rmtree(member.directory / f"{member.name}.data", ignore_errors=True)
            self.members = self._members(len(self.members))
        return self

    def wait_healthy(self, timeout_s: float = 30.0, *, every_member: bool = False) -> None:
        """Until every running member answers (``every_member``: every member, and one that has
        exited fails at once — as at a cluster's start, where none is meant to be down)."""
        deadline = time.monotonic() + timeout_s
        while True:
            problems = []
            for member in self.members:
                if not member.alive:
                    if every_member:
                        raise RuntimeError(f"etcd member {member.name} exited while the cluster started:\n"
                                           + (member.log.read_text()[-2000:] if member.log.exists() else ""))
                    continue
                try:
                    answer = httpx.post(f"{member.client_url}/v3/kv/range", json={"key": "Lw=="}, timeout=1.0)
                    if answer.status_code != 200:
                        problems.append(f"{member.name}: {answer.status_code}")
                except httpx.HTTPError as exc:
                    problems.append(f"{member.name}: {exc!r}")
            if not problems:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(m.log.read_text()[-2000:] for m in self.members if m.log.exists())
                raise RuntimeError(f"etcd did not become healthy: {problems}\n{logs}")
            time.sleep(0.1)

    def restart(self, index: int) -> None:
        self.members[index].start()

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
