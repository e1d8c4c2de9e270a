"""A history of client operations and its checker, in the spirit of Jepsen.

Clients (``serving.local.workload``) record every operation with its invocation and completion
time and its outcome — ``ok``, ``fail`` (a definite refusal: it did not happen) or ``unknown`` (a
timeout or a dropped connection: it may or may not have happened, now or later). The nemesis
(``serving.local.nemesis``) records what it did and when. Afterwards :func:`check` reads the
history and the cluster's final state and reports every anomaly with the minimal history around it.

The model: each document id belongs to one client, whose operations on it are sequential and
numbered (``n``); an upsert writes content tagged with its ``n``, so a read says exactly which
write it sees. What is checked:

* **final state** — after the run every document holds the content of its last acknowledged write
  (absent after an acknowledged delete), or of an ``unknown`` write issued after it. A lost
  acknowledged upsert and a deleted document that came back are both caught here.
* **session reads** — a read with ``consistency: session`` and the ``min_seq`` of the client's
  writes sees the client's last acknowledged write (or a later unknown one), and never a state
  older than one the client already saw (reads never go backwards).
* **one version per answer** — every hit of an answer is in the answer's embedding version.
* **replicas converge** — every replica of a shard ends with the same digest and applied seq.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

OUTCOMES = ("ok", "fail", "unknown")


@dataclass(slots=True)
class Op:
    client: int
    kind: str  # upsert | delete | read (a session read of one document) | query (any answer's versions)
    doc_id: str | None
    n: int  # the client's number of this op (an upsert's content carries it)
    gateway: str = ""
    invoked: float = 0.0  # seconds since the history began
    completed: float = 0.0
    outcome: str = "pending"  # ok | fail | unknown
    found: int | None = None  # read: the n of the content seen (None: absent)
    seq: dict[str, int] | None = None  # write: the per-shard seqs it returned; read: the min_seq it asked
    term: dict[str, int] | None = None  # ... and the terms (min_term)
    versions: tuple[str, ...] = ()  # query: the answer's version, then each hit's
    detail: str = ""

    def line(self) -> str:
        what = {"upsert": f"upsert {self.doc_id} = v{self.n}", "delete": f"delete {self.doc_id} (op {self.n})",
                "read": f"session read {self.doc_id}", "query": "query"}[self.kind]
        seen = ""
        if self.kind == "read" and self.outcome == "ok":
            seen = f" -> {'absent' if self.found is None else f'v{self.found}'}"
        if self.kind == "query" and self.outcome == "ok":
            seen = f" -> answer {self.versions[0]}, hits {sorted(set(self.versions[1:]))}"
        if self.kind in ("upsert", "delete", "read") and self.seq:
            at = ", ".join(f"{s}: {self.seq[s]}/t{(self.term or {}).get(s, '?')}" for s in sorted(self.seq))
            seen += f" (seq/term {at})" if self.kind != "read" else f" (asked seq/term {at})"
        extra = f" [{self.detail}]" if self.detail else ""
        return (f"{self.invoked:8.3f} c{self.client} invoke {what} via {self.gateway}\n"
                f"{self.completed:8.3f} c{self.client} {self.outcome:<7} {what}{seen}{extra}")


@dataclass(slots=True)
class Event:
    at: float
    text: str


@dataclass
class History:
    """Thread-safe: clients and the nemesis append while the run goes on."""

    started: float = field(default_factory=time.monotonic)
    wall_started: float = field(default_factory=time.time)  # to line the history up with the processes' logs
    ops: list[Op] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def now(self) -> float:
        return time.monotonic() - self.started

    def invoke(self, op: Op) -> Op:
        op.invoked = self.now()
        return op

    def complete(self, op: Op, outcome: str, **values: object) -> Op:
        assert outcome in OUTCOMES, outcome
        op.completed, op.outcome = self.now(), outcome
        for name, value in values.items():
            setattr(op, name, value)
        with self._lock:
            self.ops.append(op)
        return op

    def event(self, text: str) -> Event:
        happened = Event(self.now(), text)
        with self._lock:
            self.events.append(happened)
        return happened

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = defaultdict(int)
        for op in self.ops:
            counted[f"{op.kind}:{op.outcome}"] += 1
            counted[op.outcome] += 1
        counted["operations"] = len(self.ops)
        return dict(counted)


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str  # lost-write | resurrected-delete | stale-session-read | mixed-versions | diverged-replicas
    subject: str
    message: str
    history: tuple[str, ...]

    def text(self) -> str:
        lines = [line for entry in self.history for line in entry.splitlines()]
        return f"{self.kind} ({self.subject}): {self.message}\n" + "\n".join(f"  {line}" for line in lines)


@dataclass
class Report:
    anomalies: list[Anomaly]
    counts: dict[str, int]
    wall_started: float = 0.0  # the wall-clock time of the history's second 0 (the logs' timestamps)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def text(self, limit: int = 5) -> str:
        head = f"{len(self.anomalies)} anomalies in {self.counts.get('operations', 0)} operations"
        if self.wall_started:
            clock = time.strftime("%H:%M:%S", time.localtime(self.wall_started))
            head += f" (second 0 of the history: {clock}.{int(self.wall_started % 1 * 1000):03d} in the logs)"
        return "\n\n".join([head, *(a.text() for a in self.anomalies[:limit])])


class _Document:
    """What one client's ops say about one of its documents, walked in the client's order."""

    def __init__(self, ops: list[Op]) -> None:
        self.writes = [op for op in ops if op.kind in ("upsert", "delete")]

    def allowed(self, before: float, floor: int) -> tuple[set[int | None], int]:
        """States a read invoked at ``before`` may see: the newest write at or after ``floor`` (an
        op number the client knows took effect) that was acknowledged before the read, then any
        unknown write after it. A state is the n of the content (None: absent). Also the new floor."""
        done = [w for w in self.writes if w.completed <= before or w.invoked <= before and w.outcome == "unknown"]
        acked = [w for w in done if w.outcome == "ok" and w.n >= floor]
        base = max(acked, key=lambda w: w.n) if acked else next((w for w in done if w.n == floor), None)
        start = base.n if base is not None else floor
        states: set[int | None] = {_state(base) if base is not None else (None if floor < 0 else floor)}
        states |= {_state(w) for w in done if w.outcome == "unknown" and w.n > start}
        return states, start

    def op(self, n: int) -> Op | None:
        return next((w for w in self.writes if w.n == n), None)


def _state(op: Op) -> int | None:
    return op.n if op.kind == "upsert" else None


def check(history: History, final: Mapping[str, int | None],
          digests: Mapping[int, Mapping[str, tuple[str, int]]] | None = None) -> Report:
    """Every anomaly of the run. ``final``: each document the clients wrote → the n of the content
    it holds after the run (None: absent), read once the cluster healed; ``digests``: shard →
    replica → (digest, applied seq)."""
    anomalies: list[Anomaly] = []
    by_doc: dict[str, list[Op]] = defaultdict(list)
    for op in sorted(history.ops, key=lambda o: (o.invoked, o.n)):
        if op.doc_id is not None:
            by_doc[op.doc_id].append(op)
    end = max((op.completed for op in history.ops), default=0.0) + 1.0
    for doc_id, ops in by_doc.items():
        document, floor = _Document(ops), -1
        for read in (op for op in ops if op.kind == "read" and op.outcome == "ok"):
            states, start = document.allowed(read.invoked, floor)
            if read.found not in states:
                anomalies.append(Anomaly("stale-session-read", doc_id, f"a session read saw {_name(read.found)}; "
                                         f"after what the client wrote and saw it may see only "
                                         f"{_names(states)}", _around(history, ops, read)))
            floor = _after_read(document, read.found, start)
        states, _ = document.allowed(end, floor)
        if doc_id in final and final[doc_id] not in states:
            found = final[doc_id]
            kind = "resurrected-delete" if found is not None and None in states else "lost-write"
            anomalies.append(Anomaly(kind, doc_id, f"after the run it holds {_name(found)}; the history allows "
                                     f"only {_names(states)}", _around(history, ops, None)))
    for op in history.ops:
        if op.kind == "query" and op.outcome == "ok" and len(set(op.versions)) > 1:
            anomalies.append(Anomaly("mixed-versions", f"query by c{op.client} at {op.invoked:.3f}",
                                     f"an answer in {op.versions[0]} holds hits of {sorted(set(op.versions[1:]))}",
                                     (op.line(),)))
    for shard, replicas in (digests or {}).items():
        if len(set(replicas.values())) > 1:
            anomalies.append(Anomaly("diverged-replicas", f"shard {shard}", "replicas end with different content: " +
                                     ", ".join(f"{r}: {d[:12]} at seq {s}" for r, (d, s) in sorted(replicas.items())),
                                     tuple(f"{e.at:8.3f} nemesis {e.text}" for e in history.events[-5:])))
    return Report(anomalies, history.counts(), history.wall_started)


def _after_read(document: _Document, found: int | None, start: int) -> int:
    """The floor after a read: the write it saw (an absent document: the delete that explains it)."""
    if found is not None:
        return found
    deletes = [w.n for w in document.writes if w.kind == "delete" and w.n >= start]
    return min(deletes) if deletes else start


def _name(state: int | None) -> str:
    return "nothing (absent)" if state is None else f"v{state}"


def _names(states: Iterable[int | None]) -> str:
    return ", ".join(sorted(_name(s) for s in states))


def _around(history: History, ops: list[Op], anomaly: Op | None) -> tuple[str, ...]:
    """The document's ops up to the anomaly (the last 8 writes before it and every read among
    them) and the nemesis events in that window: the least history that shows what happened."""
    until = anomaly.completed if anomaly is not None else float("inf")
    mine = [op for op in ops if op.invoked <= until]
    writes = [op for op in mine if op.kind in ("upsert", "delete")][-8:]
    since = min((op.invoked for op in writes), default=0.0)
    shown = [op for op in mine if op.invoked >= since]
    events = [e for e in history.events if since - 5.0 <= e.at <= (until if until != float("inf") else e.at)]
    lines = [(op.invoked, op.line()) for op in shown] + [(e.at, f"{e.at:8.3f} nemesis {e.text}") for e in events]
    return tuple(text for _, text in sorted(lines, key=lambda pair: pair[0]))
