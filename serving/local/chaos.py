"""Chaos for a local cluster: kill -9 a random shard replica on a schedule while queries run,
and account for every answer (full, partial with the shards it names, error, wrong version).

    monkey = ChaosMonkey(cluster, every_s=5.0, seed=1)
    load = QueryLoad(cluster.gateway_url, bodies, clients=4)
    with monkey, load:
        time.sleep(60)
    report = load.report(monkey)

The monkey only kills a replica whose shard has every replica alive, so one shard never loses
all its replicas to the monkey alone (the supervisor brings each victim back with back-off).
Used by tests/integration/test_chaos.py and benchmarks/chaos.py.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.local.launcher import Child, LocalCluster


@dataclass
class Kill:
    at_s: float
    name: str
    pid: int


class ChaosMonkey:
    def __init__(self, cluster: LocalCluster, *, every_s: float = 5.0, seed: int = 0) -> None:
        self.cluster = cluster
        self.every_s = every_s
        self.random = random.Random(seed)
        self.kills: list[Kill] = []
        self.skipped = 0  # rounds with no shard whose replicas were all up
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-monkey")
        self._started = 0.0

    def _candidates(self) -> list[Child]:
        candidates = []
        for group in self.cluster.shards:
            if all(c.process is not None and c.process.poll() is None and c.ready for c in group):
                candidates.extend(group)
        return candidates

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            candidates = self._candidates()
            if not candidates:
                self.skipped += 1
                continue
            victim = self.random.choice(candidates)
            assert victim.process is not None
            try:
                os.kill(victim.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append(Kill(time.monotonic() - self._started, victim.name, victim.process.pid))

    def __enter__(self) -> ChaosMonkey:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Answer:
    at_s: float
    latency_s: float
    status: int
    partial: bool = False
    missing: list[int] = field(default_factory=list)
    versions_ok: bool = True
    version: str | None = None
    error: str | None = None


class QueryLoad:
    """``clients`` closed-loop clients sending ``bodies`` round robin to POST /v1/query."""

    def __init__(self, url: str, bodies: Sequence[dict[str, Any]], *, clients: int = 4, timeout_s: float = 30.0,
                 expected_versions: set[str] | None = None) -> None:
        self.url = url
        self.bodies = list(bodies)
        self.clients = clients
        self.timeout_s = timeout_s
        self.expected_versions = expected_versions
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]
        self._started = 0.0

    def _client(self, offset: int) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=self.timeout_s) as http:
            i = offset
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    response = http.post("/v1/query", json=self.bodies[i % len(self.bodies)])
                    answer = self._judge(response.status_code, response.json(), sent)
                except Exception as exc:  # noqa: BLE001 - a transport failure is an error answer
                    answer = Answer(sent - self._started, time.monotonic() - sent, 0, error=repr(exc))
                self.answers.append(answer)
                i += self.clients

    def _judge(self, status: int, body: dict[str, Any], sent: float) -> Answer:
        answer = Answer(sent - self._started, time.monotonic() - sent, status)
        if status != 200:
            answer.error = str(body.get("error", body))[:300]
            return answer
        answer.partial = bool(body.get("partial"))
        answer.missing = [m.get("shard") for m in body.get("missing_shards", [])]
        answer.version = body.get("version")
        hit_versions = {h.get("version", answer.version) for h in body.get("hits", [])}
        answer.versions_ok = hit_versions <= {answer.version} and (
            self.expected_versions is None or answer.version in self.expected_versions)
        return answer

    def __enter__(self) -> QueryLoad:
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 5)

    def report(self, monkey: ChaosMonkey | None = None) -> dict[str, Any]:
        answers = list(self.answers)
        total = max(len(answers), 1)
        errors = [a for a in answers if a.error is not None]
        partial = [a for a in answers if a.error is None and a.partial]
        unflagged = [a for a in partial if not a.missing]  # degraded but not saying which shard
        wrong = [a for a in answers if a.error is None and not a.versions_ok]
        latencies = np.array([a.latency_s for a in answers if a.error is None]) * 1000.0
        full = len(answers) - len(errors) - len(partial)
        report: dict[str, Any] = {
            "requests": len(answers), "full": full, "full_pct": 100.0 * full / total,
            "partial": len(partial), "partial_pct": 100.0 * len(partial) / total,
            "partial_unflagged": len(unflagged),
            "partial_missing_shards": sorted({s for a in partial for s in a.missing}),
            "errors": len(errors), "error_examples": [a.error for a in errors[:5]],
            "wrong_version": len(wrong),
            "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
            "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
            "p999_ms": float(np.percentile(latencies, 99.9)) if latencies.size else None,
        }
        if monkey is not None:
            report["kills"] = len(monkey.kills)
            report["kills_skipped"] = monkey.skipped
            report["killed"] = [k.name for k in monkey.kills]
        return report
