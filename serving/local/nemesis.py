"""The nemesis: a seeded random schedule of faults over a :class:`~serving.local.lab.Lab`, each
held a few seconds and then healed, every step written to the run's history.

Fault kinds (``KINDS``):

* ``partition-primary``  a shard's primary cut from its other replicas, both ways
* ``one-way-primary``    a shard's primary receives nothing from any other host (it can still send)
* ``gateway-etcd``       a gateway cut from every etcd member
* ``etcd-minority``      one etcd member cut from every other host
* ``link-down``          a shard replica's interface down (cut from everyone, clients too)
* ``kill``               SIGKILL a primary, a gateway or an etcd member (restarted after the hold)
* ``pause``              SIGSTOP a primary for the hold, then SIGCONT
* ``latency``            the shard server's own fault injection: +LAT ms on one replica's searches

The plan — which kind, which shard or member, how long, the gaps — is drawn up front from the seed
and printed (:meth:`Nemesis.plan_text`), so a failing run is replayed with the same seed; which
replica is "the primary" is resolved when the step runs (and logged).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import httpx

from serving.local.history import History
from serving.local.lab import Lab

KINDS = ("partition-primary", "one-way-primary", "gateway-etcd", "etcd-minority", "link-down", "kill", "pause",
         "latency")


@dataclass(frozen=True, slots=True)
class Step:
    at_s: float  # when it starts, from the nemesis' start
    kind: str
    target: int  # shard, gateway or etcd member index (kind-dependent); kill: see ``victim``
    hold_s: float
    victim: str = ""  # kill: primary | gateway | etcd

    def text(self) -> str:
        what = {"gateway-etcd": f"gateway {self.target}", "etcd-minority": f"etcd member {self.target}",
                "kill": f"{self.victim} {self.target}"}.get(self.kind, f"shard {self.target}")
        return f"{self.at_s:6.1f} s  {self.kind:<18} {what:<14} for {self.hold_s:.1f} s"


def plan(seed: int, duration_s: float, *, shards: int, gateways: int, etcd_members: int,
         kinds: Sequence[str] = KINDS, gap_s: tuple[float, float] = (1.0, 3.0),
         hold_s: tuple[float, float] = (2.0, 5.0)) -> list[Step]:
    """The schedule for ``seed``: the kinds in turn first (each at least once when time allows),
    then at random."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown nemesis kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    steps: list[Step] = []
    at = rng.uniform(*gap_s)
    while at < duration_s:
        kind = kinds[len(steps)] if len(steps) < len(kinds) else rng.choice(list(kinds))
        hold = rng.uniform(*hold_s)
        victim = rng.choice(["primary", "gateway", "etcd"]) if kind == "kill" else ""
        count = {"gateway-etcd": gateways, "etcd-minority": etcd_members, "gateway": gateways,
                 "etcd": etcd_members}.get(kind if kind != "kill" else victim, shards)
        steps.append(Step(round(at, 2), kind, rng.randrange(count), round(hold, 2), victim))
        at += hold + rng.uniform(*gap_s)
    return steps


def _nothing() -> None:
    """What heals a killed primary or gateway 0: the launcher's supervisor restarts them."""


class Nemesis:
    def __init__(self, lab: Lab, history: History, steps: list[Step], *, seed: int,
                 on_step: Callable[[str], None] | None = None, latency_ms: float = 300.0) -> None:
        self.lab, self.history, self.steps, self.seed = lab, history, steps, seed
        self.on_step = on_step or (lambda text: print(f"nemesis: {text}", flush=True))
        self.latency_ms = latency_ms
        self.done: list[tuple[Step, str, float, float]] = []  # (step, what it hit, began, healed: history time)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nemesis")
        self.error: BaseException | None = None

    def plan_text(self) -> str:
        return f"nemesis schedule (seed {self.seed}):\n" + "\n".join(f"  {s.text()}" for s in self.steps)

    def start(self) -> Nemesis:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        if self.error is not None:
            raise RuntimeError(f"the nemesis failed: {self.error!r}") from self.error

    def _run(self) -> None:
        try:
            for step in self.steps:
                if self._stop.wait(max(0.0, self._started + step.at_s - time.monotonic())):
                    return
                self._do(step)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def _log(self, text: str) -> None:
        self.history.event(text)
        self.on_step(f"{self.history.now():8.3f} {text}")

    # -- one step ------------------------------------------------------------------------------
    def _do(self, step: Step) -> None:
        lab, net = self.lab, self.lab.net
        assert net is not None and lab.etcd is not None and lab.cluster is not None
        heal: Callable[[], object] = net.heal
        if step.kind in ("partition-primary", "one-way-primary", "link-down", "pause", "latency") or \
                step.victim == "primary":
            replica = self.primary(step.target) if step.kind != "link-down" else \
                random.Random(self.seed + int(step.at_s * 100)).randrange(lab.replicas)
            name = f"shard-{step.target}-r{replica}"
            host = lab.host(name)
            others = [h for h in net.hosts.values() if h.name != name]
            if step.kind == "partition-primary":
                peers = [lab.host(f"shard-{step.target}-r{r}") for r in range(lab.replicas) if r != replica]
                net.partition([host], peers)
            elif step.kind == "one-way-primary":
                net.partition([host], others, one_way=True)
            elif step.kind == "link-down":
                net.link_down(host)
            elif step.kind == "pause":
                pid = self._pid(lab.cluster.shards[step.target][replica].process)
                os.kill(pid, signal.SIGSTOP)
                heal = partial(os.kill, pid, signal.SIGCONT)
            elif step.kind == "latency":
                url = lab.shard_urls[step.target][replica]
                self._faults(url, {"latency": f"fixed:{self.latency_ms:g}"})
                heal = partial(self._faults, url, {})
            else:  # kill the primary: the launcher's supervisor restarts it
                os.kill(self._pid(lab.cluster.shards[step.target][replica].process), signal.SIGKILL)
                heal = _nothing
            hit = name
        elif step.kind == "gateway-etcd":
            hit = f"gateway-{step.target}"
            net.partition([lab.host(hit)], [lab.host(f"etcd-{i}") for i in range(lab.etcd_count)])
        elif step.kind == "etcd-minority":
            hit = f"etcd-{step.target}"
            net.partition([lab.host(hit)], [h for h in net.hosts.values() if h.name != hit])
        elif step.victim == "gateway":
            hit = f"gateway-{step.target}"
            os.kill(self._pid(lab.gateway_child(step.target).process), signal.SIGKILL)
            # gateway 0 is the launcher's (its supervisor restarts it); the others restart here
            heal = _nothing if step.target == 0 else partial(lab.restart_gateway, step.target)
        else:
            hit = f"etcd-{step.target}"
            lab.etcd.members[step.target].kill()
            heal = partial(lab.etcd.restart, step.target)
        self._log(f"start {step.kind} {hit} for {step.hold_s:.1f} s")
        began = self.history.now()
        self._stop.wait(step.hold_s)
        heal()
        self.done.append((step, hit, began, self.history.now()))
        self._log(f"heal  {step.kind} {hit}")

    def primary(self, shard: int, timeout_s: float = 30.0) -> int:
        """The replica index of ``shard``'s primary as its replicas report it (newest term wins)."""
        urls = self.lab.shard_urls[shard]
        deadline = time.monotonic() + timeout_s
        while True:
            found = []
            for index, url in enumerate(urls):
                try:
                    role = httpx.get(f"{url}/v1/info", timeout=2).json().get("role") or {}
                except (httpx.HTTPError, ValueError):
                    continue
                if role.get("is_primary"):
                    found.append((int(role["term"]), index))
            if found:
                return max(found)[1]
            if time.monotonic() > deadline:
                return random.Random(self.seed + shard).randrange(len(urls))  # none elected yet: any replica
            time.sleep(0.2)

    @staticmethod
    def _pid(process: object) -> int:
        pid = getattr(process, "pid", None)
        if pid is None:
            raise RuntimeError("the nemesis' target is not running")
        return int(pid)

    @staticmethod
    def _faults(url: str, spec: dict[str, object]) -> None:
        httpx.put(f"{url}/admin/faults", json=spec, timeout=5).raise_for_status()
