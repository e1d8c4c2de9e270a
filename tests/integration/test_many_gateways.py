"""Three gateways over one cluster through a real 3-member etcd (2 shards × 3 replica processes):
clients upsert, overwrite and delete through all three while a nemesis SIGKILLs a gateway, a
shard's primary or an etcd member every few seconds (a killed gateway comes back on an empty
disk). Afterwards every acknowledged write is there with its last content, no acknowledged delete
has come back, the replicas of each shard are digest-equal, and no seq is held by two replicas
with different content (issue 33, acceptance 1 and 3)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval import env
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.etcd import EtcdCluster
from tests.helpers.gateway_process import Gateway
from tests.helpers.roles import primary_index
from tests.integration.test_primaries import assert_converged

# alone (tests/sharing.py): leases and a kill schedule in real time
pytestmark = [pytest.mark.slow, pytest.mark.alone]
RUN_S = float(env.read("SHARDRAG_CHAOS_S", "25") or 25)  # a longer run: SHARDRAG_CHAOS_S=600
SEED = int(env.read("SHARDRAG_CHAOS_SEED", "33") or 33)
CLIENTS = 3
IDS_PER_CLIENT = 8


@dataclass
class Op:
    client: int
    kind: str  # upsert | delete
    doc_id: str
    content: str | None  # the text an upsert writes (None: a delete)
    outcome: str = "pending"  # ok | unknown | fail
    started: float = 0.0
    ended: float = 0.0


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)

    def acceptable(self, doc_id: str) -> tuple[set[str | None], list[Op]]:
        """Final states the document may be in: after its last acknowledged op, or after any op
        whose outcome is unknown that came later (one client owns each id: its ops are ordered).
        None: absent (deleted, or never written)."""
        ops = [op for op in self.ops if op.doc_id == doc_id]
        last_ok = max((i for i, op in enumerate(ops) if op.outcome == "ok"), default=-1)
        states: set[str | None] = {ops[last_ok].content if last_ok >= 0 else None}
        states |= {op.content for op in ops[last_ok + 1:] if op.outcome == "unknown"}
        return states, ops


def client_loop(index: int, gateways: list, stop: threading.Event, history: History, dim: int) -> None:
    rng = random.Random(SEED * 100 + index)
    n = 0
    with httpx.Client(timeout=45) as http:
        while not stop.is_set():
            n += 1
            doc_id = f"c{index}-{rng.randrange(IDS_PER_CLIENT)}"
            kind = "delete" if rng.random() < 0.25 else "upsert"
            content = f"{doc_id} version {n}" if kind == "upsert" else None
            gateway = gateways[n % len(gateways)]
            op = Op(index, kind, doc_id, content, started=time.monotonic())
            key = f"c{index}-op{n}"
            if kind == "upsert":
                vector = np.random.default_rng(index * 100_000 + n).standard_normal(dim).astype(np.float32)
                body = {"documents": [{"id": doc_id, "title": content, "vector": (vector / np.linalg.norm(vector))
                                       .tolist()}], "idempotency_key": key}
                path = "/v1/documents"
            else:
                body, path = {"ids": [doc_id], "idempotency_key": key}, "/v1/documents/delete"
            try:
                response = http.post(f"{gateway.url}{path}", json=body)
                op.outcome = "ok" if response.status_code == 200 else (
                    "fail" if response.status_code in (400, 409, 422) else "unknown")
            except httpx.HTTPError:
                op.outcome = "unknown"  # the gateway died mid-request: applied or not, we cannot know
            op.ended = time.monotonic()
            history.add(op)
            if op.outcome != "ok":
                time.sleep(0.1)


def test_three_gateways_writes_through_kills_of_gateways_primaries_and_etcd_members(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents[:300], msmarco.vectors[:300], msmarco.version, BuildConfig("many", 2),
                     show_progress=False)
    dim = msmarco.vectors.shape[1]
    rng = random.Random(SEED)
    schedule: list[str] = []
    with EtcdCluster(tmp_path, members=3) as etcd:
        config = GatewayConfig.from_dict({"encoder": {"load": False}, "writes": {"timeout_s": 20.0},
                                          "cluster": {"coordinator": etcd.spec}})
        with LocalCluster(root, "many", replicas=3, gateway=config, workdir=tmp_path / "work",
                          shard_args=("--lease-s", "2")) as cluster:
            extra = [Gateway(cluster.workdir / "cluster.json", tmp_path / f"gateway-{i}.log", tmp_path / "homes")
                     for i in (1, 2)]
            for gateway in extra:
                gateway.start()

            class Main:  # the launcher's own gateway: its supervisor restarts it on the same port
                url = cluster.gateway_url

            gateways = [Main(), *extra]
            history, stop = History(), threading.Event()
            clients = [threading.Thread(target=client_loop, args=(i, gateways, stop, history, dim))
                       for i in range(CLIENTS)]
            for thread in clients:
                thread.start()
            deadline = time.monotonic() + RUN_S
            kinds = ["gateway", "primary", "etcd"]
            try:
                step = 0
                while time.monotonic() < deadline:
                    time.sleep(rng.uniform(2.0, 4.0))
                    kind = kinds[step % 3] if step < 3 else rng.choice(kinds)
                    step += 1
                    if kind == "gateway":
                        victim = rng.randrange(3)
                        schedule.append(f"{time.monotonic():.1f} kill gateway {victim}")
                        if victim == 0:
                            os.kill(cluster.gateway.process.pid, signal.SIGKILL)
                        else:
                            extra[victim - 1].kill()
                            extra[victim - 1].start()
                    elif kind == "primary":
                        shard = rng.randrange(2)
                        index = primary_index(cluster.shard_urls[shard], timeout_s=30)
                        schedule.append(f"{time.monotonic():.1f} kill primary of shard {shard} (replica {index})")
                        os.kill(cluster.shards[shard][index].process.pid, signal.SIGKILL)
                    else:
                        member = rng.randrange(3)
                        schedule.append(f"{time.monotonic():.1f} kill etcd member {member}")
                        etcd.members[member].kill()
                        time.sleep(1.0)
                        etcd.restart(member)
            finally:
                stop.set()
                for thread in clients:
                    thread.join(120)
                print(f"nemesis schedule (seed {SEED}):\n  " + "\n  ".join(schedule))
            etcd.wait_healthy()
            acked = [op for op in history.ops if op.outcome == "ok"]
            print(f"{len(history.ops)} operations: {len(acked)} acknowledged, "
                  f"{sum(op.outcome == 'unknown' for op in history.ops)} unknown, "
                  f"{sum(op.outcome == 'fail' for op in history.ops)} refused")
            assert all(not thread.is_alive() for thread in clients)
            assert len(acked) >= 30, f"too few writes were acknowledged: {len(history.ops)} ops, {len(acked)} ok"
            for shard in range(2):
                assert_converged(cluster.shard_urls[shard], msmarco.version.id, timeout_s=90)
            with httpx.Client(base_url=cluster.gateway_url, timeout=30) as http:
                for client in range(CLIENTS):
                    for n in range(IDS_PER_CLIENT):
                        doc_id = f"c{client}-{n}"
                        states, ops = history.acceptable(doc_id)
                        answer = http.get(f"/v1/documents/{doc_id}")
                        assert answer.status_code in (200, 404), answer.text
                        found = answer.json()["title"] if answer.status_code == 200 else None
                        assert found in states, (f"{doc_id} holds {found!r}; acceptable {states}; its history:\n" +
                                                 "\n".join(f"  {o.kind} {o.content} {o.outcome}" for o in ops))
            for gateway in extra:
                gateway.stop()
