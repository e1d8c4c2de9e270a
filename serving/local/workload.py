"""The clients of a checked run: threads that upsert, delete, read their own writes and query
through several gateways, recording each operation in a :class:`~serving.local.history.History`.

Each client owns ``ids_per_client`` document ids (``c<client>-<k>``), so the operations on a
document are sequential and the checker knows exactly which write a read sees: an upsert writes
title ``"<id> v<n>"`` (``n``: the client's op number) and a text made of it. A session read asks
for one document (``filter: has_id``) with ``consistency: session`` and the ``min_seq`` and
``min_term`` of the client's acknowledged writes, pinned to the version those writes returned
(seqs are per version).

Outcomes: 200 → ok; 400/409/422 → fail (refused: it did not happen); anything else, a timeout
or a dropped connection → unknown (it may have happened, now or later).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from serving.local.history import History, Op

WORDS = ("shard replica primary term lease etcd gateway rollout partition quorum vector index segment "
         "compaction snapshot digest history anomaly nemesis latency").split()
REFUSED = (400, 409, 422)


@dataclass(frozen=True, slots=True)
class Mix:
    """Shares of each operation (the rest: eventual queries)."""

    upsert: float = 0.5
    delete: float = 0.12
    read: float = 0.25
    timeout_s: float = 30.0
    pause_after_error_s: float = 0.1


def title_n(title: str) -> int | None:
    """The op number an upsert's title carries (``"c0-3 v17"`` → 17)."""
    tail = title.rsplit(" v", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None


class Workload:
    """``clients`` threads over ``gateways`` (URLs, or a callable giving the current ones)."""

    def __init__(self, gateways: Sequence[str] | Callable[[], Sequence[str]], history: History, *, clients: int = 3,
                 ids_per_client: int = 8, seed: int = 0, mix: Mix | None = None) -> None:
        self.gateways = gateways if callable(gateways) else (lambda urls=tuple(gateways): urls)
        self.history = history
        self.clients = clients
        self.ids_per_client = ids_per_client
        self.seed = seed
        self.mix = mix or Mix()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True, name=f"client-{i}")
                         for i in range(clients)]

    @property
    def doc_ids(self) -> list[str]:
        return [f"c{c}-{k}" for c in range(self.clients) for k in range(self.ids_per_client)]

    def start(self) -> Workload:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"clients still running after {timeout_s} s: {alive}")

    def _client(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        seqs: dict[str, dict[str, tuple[int, int]]] = {}  # version → shard → the newest (term, seq) a write returned
        last_version: dict[str, str] = {}  # doc → the version its last acknowledged write returned
        n = 0
        with httpx.Client(timeout=self.mix.timeout_s) as http:
            while not self._stop.is_set():
                n += 1
                doc_id = f"c{index}-{rng.randrange(self.ids_per_client)}"
                urls = self.gateways()
                gateway = urls[(index + n) % len(urls)]
                dice = rng.random()
                if dice < self.mix.upsert + self.mix.delete:
                    kind = "upsert" if dice < self.mix.upsert else "delete"
                    op = self._write(http, gateway, Op(index, kind, doc_id, n), seqs, last_version, rng)
                elif dice < self.mix.upsert + self.mix.delete + self.mix.read and doc_id in last_version:
                    op = self._read(http, gateway, Op(index, "read", doc_id, n), seqs[last_version[doc_id]],
                                    last_version[doc_id])
                else:
                    op = self._query(http, gateway, Op(index, "query", None, n), rng)
                if op.outcome != "ok":
                    self._stop.wait(self.mix.pause_after_error_s)

    def _call(self, http: httpx.Client, op: Op, gateway: str, path: str, body: dict[str, Any]
              ) -> tuple[str, dict[str, Any] | None, str]:
        op.gateway = gateway.rsplit("//", 1)[-1]
        self.history.invoke(op)
        try:
            response = http.post(f"{gateway}{path}", json=body)
        except httpx.HTTPError as exc:
            return "unknown", None, type(exc).__name__
        if response.status_code == 200:
            return "ok", response.json(), ""
        outcome = "fail" if response.status_code in REFUSED else "unknown"
        return outcome, None, f"{response.status_code} {response.text[:160]}"

    def _write(self, http: httpx.Client, gateway: str, op: Op, seqs: dict[str, dict[str, tuple[int, int]]],
               last_version: dict[str, str], rng: random.Random) -> Op:
        key = f"c{op.client}-op{op.n}-s{self.seed}"
        if op.kind == "upsert":
            title = f"{op.doc_id} v{op.n}"
            text = f"{title} " + " ".join(rng.choice(WORDS) for _ in range(8))
            path, body = "/v1/documents", {"documents": [{"id": op.doc_id, "title": title, "text": text}],
                                           "idempotency_key": key}
        else:
            path, body = "/v1/documents/delete", {"ids": [str(op.doc_id)], "idempotency_key": key}
        outcome, answer, detail = self._call(http, op, gateway, path, body)
        if answer is not None:
            version = str(answer["version"])
            mine = seqs.setdefault(version, {})
            terms = answer.get("term", {})
            for shard, seq in answer.get("seq", {}).items():
                mine[shard] = max(mine.get(shard, (0, 0)), (int(terms.get(shard, 0)), int(seq)))
            last_version[str(op.doc_id)] = version
        return self.history.complete(op, outcome, seq=answer.get("seq") if answer else None,
                                     term=answer.get("term") if answer else None, detail=detail)

    def _read(self, http: httpx.Client, gateway: str, op: Op, floors: dict[str, tuple[int, int]], version: str
              ) -> Op:
        op.seq, op.term = {s: seq for s, (_, seq) in floors.items()}, {s: term for s, (term, _) in floors.items()}
        body = {"text": str(op.doc_id), "k": 3, "consistency": "session", "min_seq": op.seq, "min_term": op.term,
                "version": version, "filter": {"must": [{"has_id": [op.doc_id]}]}}
        outcome, answer, detail = self._call(http, op, gateway, "/v1/query", body)
        if answer is not None and answer.get("partial"):
            outcome, detail = "fail", f"partial answer: missing {answer.get('missing_shards')}"
        found = None
        if answer is not None and outcome == "ok":
            found = next((title_n(h["title"]) for h in answer["hits"] if h["doc_id"] == op.doc_id), None)
        return self.history.complete(op, outcome, found=found, detail=detail)

    def _query(self, http: httpx.Client, gateway: str, op: Op, rng: random.Random) -> Op:
        body = {"text": " ".join(rng.choice(WORDS) for _ in range(4)), "k": 5, "with_text": False}
        outcome, answer, detail = self._call(http, op, gateway, "/v1/query", body)
        versions = (str(answer["version"]), *(str(h["version"]) for h in answer["hits"])) if answer else ()
        return self.history.complete(op, outcome, versions=versions, detail=detail)

    def final_state(self, gateway: str) -> dict[str, int | None]:
        """Each document's state after the run (the n of its content; None: absent)."""
        final: dict[str, int | None] = {}
        with httpx.Client(base_url=gateway, timeout=60) as http:
            for doc_id in self.doc_ids:
                answer = http.get(f"/v1/documents/{doc_id}")
                if answer.status_code not in (200, 404):
                    raise RuntimeError(f"reading {doc_id} after the run: {answer.status_code} {answer.text[:300]}")
                final[doc_id] = title_n(answer.json()["title"]) if answer.status_code == 200 else None
        return final


def roll_out(gateways: Callable[[], Sequence[str]], history: History, version: str, model: str,
             queries: Sequence[str], deadline: float) -> str:
    """Stage ``version`` and activate it through whichever gateway answers (a partition may cut one),
    each attempt in the history; "done", or why not by ``deadline`` (monotonic)."""
    for step, body in (("stage", {"version": version, "model": model}),
                       ("activate", {"version": version, "queries": list(queries)})):
        while True:
            urls = gateways()
            url = urls[int(time.monotonic()) % len(urls)]
            try:
                answer = httpx.post(f"{url}/admin/rollout/{step}", json=body, timeout=60)
                if answer.status_code == 200:
                    history.event(f"rollout {step} {version[:24]} done via {url}")
                    break
                reason = f"{answer.status_code} {answer.text[:200]}"
            except httpx.HTTPError as exc:
                reason = repr(exc)
            history.event(f"rollout {step} via {url} not yet: {reason}")
            if time.monotonic() > deadline:
                return f"{step} did not finish: {reason}"
            time.sleep(1.0)
    return "done"
