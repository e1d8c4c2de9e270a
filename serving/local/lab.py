"""A cluster across hosts on one machine: every etcd member, shard replica and gateway in a network
namespace of its own (``serving.local.netns``), each binding only its own address.

    with Lab(root, "docs", replicas=3, gateways=2, etcd_members=3, workdir=tmp) as lab:
        lab.gateway_urls          # http://10.x.y.n:port, one per gateway
        lab.net.partition([lab.host("shard-0-r0")], [lab.host("etcd-0")])

The shard replicas, the nodes (``nodes=N``: collections created at run time) and the first
gateway are the launcher's (``LocalCluster``, placed on their hosts; its supervisor restarts a
killed one on the same host and port); the other gateways are started here on their own hosts
(:meth:`restart_gateway` brings one back on an empty disk). The cluster state is a real etcd of
``etcd_members`` members, one per host. Stopping stops every process, then removes the namespaces
— also after an exception or Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from pathlib import Path

import httpx

from retrieval.errors import ConfigError
from serving.gateway.config import GatewayConfig
from serving.local.child import Child, stop_all
from serving.local.etcd import EtcdCluster
from serving.local.launcher import LocalCluster
from serving.local.netns import Host, Network

logger = logging.getLogger(__name__)


class Lab:
    def __init__(self, root: str | Path, collection: str, *, version: str | None = None, replicas: int = 3,
                 gateways: int = 2,
                 etcd_members: int = 3, workdir: str | Path | None = None, gateway: GatewayConfig | None = None,
                 shard_args: tuple[str, ...] = (), ready_timeout_s: float = 180.0, nodes: int = 0) -> None:
        """``nodes``: nodes for the collections created at run time, each on a host of its own
        (``node-<i>``), so a collection's replicas — on distinct nodes — are on distinct hosts."""
        if gateways < 1 or etcd_members < 1:
            raise ConfigError("a lab needs at least one gateway and one etcd member",
                              field="gateways" if gateways < 1 else "etcd_members")
        self.root, self.collection, self.version, self.replicas = Path(root), collection, version, replicas
        self.gateway_count, self.etcd_count = gateways, etcd_members
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="shardrag-lab-"))
        self.gateway_config = gateway or GatewayConfig()
        self.shard_args = shard_args
        self.ready_timeout_s = ready_timeout_s
        self.node_count = nodes
        self.net: Network | None = None
        self.etcd: EtcdCluster | None = None
        self.cluster: LocalCluster | None = None
        self.extra_gateways: list[Child] = []

    # -- start -------------------------------------------------------------------------------
    def start(self) -> Lab:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.net = Network()
            etcd_hosts = [self.net.add_host(f"etcd-{i}") for i in range(self.etcd_count)]
            self.etcd = EtcdCluster(self.workdir, members=self.etcd_count, hosts=etcd_hosts).start(timeout_s=60)
            config = GatewayConfig.from_dict({**self.gateway_config.to_dict(),
                                              "cluster": {**self.gateway_config.to_dict().get("cluster", {}),
                                                          "coordinator": self.etcd.spec}})
            self.cluster = LocalCluster(self.root, self.collection, version=self.version, replicas=self.replicas,
                                        gateway=config,
                                        workdir=self.workdir / "cluster", shard_args=self.shard_args,
                                        ready_timeout_s=self.ready_timeout_s, placement=self._place,
                                        nodes=self.node_count)
            self.cluster.start()
            for index in range(1, self.gateway_count):
                self.extra_gateways.append(self._gateway_child(index))
                self._start_gateway(self.extra_gateways[-1])
        except BaseException:
            self.stop()
            raise
        return self

    def _place(self, name: str) -> tuple[str, list[str]]:
        """The launcher's children (shard replicas, nodes, the gateway): each on a host named after it
        (the gateway is gateway-0)."""
        assert self.net is not None
        name = "gateway-0" if name == "gateway" else name
        host = self.net.hosts.get(name) or self.net.add_host(name)
        return host.address, host.prefix

    def _gateway_child(self, index: int) -> Child:
        assert self.net is not None and self.cluster is not None
        host = self.net.add_host(f"gateway-{index}")
        spec = self.cluster.workdir / "cluster.json"

        def argv(port: int) -> list[str]:
            return [*host.prefix, self.cluster.python, "-m", "serving", "gateway",  # type: ignore[union-attr]
                    "--cluster", str(spec), "--host", host.address, "--port", str(port)]

        return Child(f"gateway-{index}", argv, self.workdir / f"gateway-{index}.log")

    def _start_gateway(self, child: Child) -> None:
        home = tempfile.mkdtemp(prefix=f"{child.name}-home-", dir=self.workdir)  # an empty disk each start
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HOME": home, "TMPDIR": home, "OMP_NUM_THREADS": "1"}
        child.start(env)
        child.wait_ready(time.monotonic() + self.ready_timeout_s)

    def restart_gateway(self, index: int) -> None:
        """Gateway ``index`` ≥ 1 started again on its host and port, on an empty disk."""
        child = self.extra_gateways[index - 1]
        if child.process is not None and child.process.poll() is None:
            child.stop()
        self._start_gateway(child)

    # -- what runs where ---------------------------------------------------------------------
    def host(self, name: str) -> Host:
        assert self.net is not None
        return self.net.hosts[name]

    def gateway_child(self, index: int) -> Child:
        assert self.cluster is not None and self.cluster.gateway is not None
        return self.cluster.gateway if index == 0 else self.extra_gateways[index - 1]

    @property
    def gateway_urls(self) -> list[str]:
        return [str(self.gateway_child(i).url) for i in range(self.gateway_count)]

    @property
    def shard_urls(self) -> list[list[str]]:
        assert self.cluster is not None
        return [[str(c.url) for c in group] for group in self.cluster.shards]

    def serving_gateway(self, index: int = 0, timeout_s: float = 90.0) -> str:
        """Gateway ``index``'s URL once it answers ``/healthz`` — a killed gateway 0 is restarted by
        the launcher's supervisor in the background (loading its encoder), so right after a run it may
        not listen yet; the URL is read again each try (a restart may move it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            url = str(self.gateway_child(index).url)
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                return url  # the caller's read then names what is wrong
            time.sleep(0.5)

    def digests(self, timeout_s: float = 90.0, settle_s: float | None = None
                ) -> dict[int, dict[str, tuple[str, int]]]:
        """Each replica's (digest, applied seq) once every shard's replicas agree, or the last seen at
        the deadline (the history checker reports what differs). ``settle_s``: also return once
        nothing has changed for that long — replicas that diverged for good (a deliberately broken
        build) never agree, while one still catching up moves its applied seq."""
        deadline = time.monotonic() + timeout_s
        last: dict[int, dict[str, tuple[str, int]]] = {}
        unchanged_since = time.monotonic()
        while True:
            digests: dict[int, dict[str, tuple[str, int]]] = {}
            for shard, urls in enumerate(self.shard_urls):
                digests[shard] = {}
                for index, url in enumerate(urls):
                    try:
                        answer = httpx.get(f"{url}/admin/digest", timeout=30).json()
                        digests[shard][f"r{index}"] = (str(answer["sha256"]), int(answer["applied_seq"]))
                    except (httpx.HTTPError, ValueError, KeyError) as exc:
                        digests[shard][f"r{index}"] = (f"unreadable: {exc!r}", -1)
            now = time.monotonic()
            if digests != last:
                last, unchanged_since = digests, now
            settled = settle_s is not None and now - unchanged_since >= settle_s
            if all(len(set(d.values())) == 1 for d in digests.values()) or settled or now > deadline:
                return digests
            time.sleep(0.5)

    def describe(self) -> dict[str, object]:
        assert self.net is not None and self.etcd is not None
        return {"subnet": str(self.net.subnet), "this machine": self.net.gateway_address,
                "hosts": {h.name: {"netns": h.netns, "address": h.address} for h in self.net.hosts.values()},
                "gateways": self.gateway_urls, "shards": self.shard_urls, "etcd": self.etcd.client_urls,
                "nodes": [str(c.url) for c in self.cluster.nodes] if self.cluster else []}

    def processes(self) -> list[int]:
        """The pid of every process of the lab now running."""
        children = [*(self.cluster.children() if self.cluster else []), *self.extra_gateways]
        pids = [c.process.pid for c in children if c.process is not None and c.process.poll() is None]
        members = self.etcd.members if self.etcd else []
        return pids + [m.process.pid for m in members if m.process is not None and m.alive]

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        if self.net is not None:
            self.net.heal()  # cut links would slow every stop
        for process in self.processes():
            try:
                os.kill(process, signal.SIGCONT)  # a paused process cannot take its SIGTERM
            except ProcessLookupError:
                pass
        stop_all(self.extra_gateways)
        if self.cluster is not None:
            self.cluster.stop()
        if self.etcd is not None:
            self.etcd.stop()
        if self.net is not None:
            self.net.close()

    def __enter__(self) -> Lab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()



def main(argv: list[str] | None = None) -> int:
    """``python -m serving.local.lab``: a lab by hand (README "A five-node cluster on one machine")."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m serving.local.lab", description=(
        "Run a built collection across hosts on this machine (root): every etcd member, shard replica and "
        "gateway in a network namespace of its own; prints each host's namespace and address, then serves "
        "until Ctrl-C, which stops every process and removes every namespace."))
    parser.add_argument("--root", default="shardrag-data", help="where collections live (default shardrag-data)")
    parser.add_argument("--collection", required=True)
    parser.add_argument("--version", help="embedding version to serve (default: the newest)")
    parser.add_argument("--replicas", type=int, default=3, help="replicas per shard (default 3)")
    parser.add_argument("--gateways", type=int, default=1, help="gateways (default 1)")
    parser.add_argument("--etcd", type=int, default=1, help="etcd members (default 1; 3 to survive one's loss)")
    parser.add_argument("--nodes", type=int, default=0,
                        help="nodes for collections created at run time, each on a host of its own (default 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with Lab(args.root, args.collection, version=args.version, replicas=args.replicas, gateways=args.gateways,
             etcd_members=args.etcd, nodes=args.nodes) as lab:
        print(json.dumps(lab.describe(), indent=1), flush=True)
        assert lab.net is not None
        host = next(iter(lab.net.hosts.values()))
        print(f"\ncut a host:  ip netns exec {host.netns} ip route add <address>/32 via {lab.net.sink} dev eth0"
              f"\ntake it down: ip -n {host.netns} link set eth0 down\nCtrl-C stops everything.", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping ...", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
