"""The history checker (serving.local.history) on hand-made histories: each anomaly it must find,
and the histories it must accept (unknown writes may or may not have happened)."""

from __future__ import annotations

from serving.local.history import History, Op, check


def record(history: History, client: int, kind: str, doc: str | None, n: int, outcome: str, at: float,
           **values: object) -> Op:
    op = Op(client, kind, doc, n, gateway="g0", invoked=at, completed=at + 0.5, outcome=outcome)
    for name, value in values.items():
        setattr(op, name, value)
    history.ops.append(op)
    return op


def kinds(report) -> list[str]:
    return [a.kind for a in report.anomalies]


def test_the_last_acknowledged_write_must_be_there():
    history = History()
    record(history, 0, "upsert", "c0-1", 1, "ok", 1.0)
    record(history, 0, "upsert", "c0-1", 2, "ok", 2.0)
    assert check(history, {"c0-1": 2}).ok
    lost = check(history, {"c0-1": 1})
    assert kinds(lost) == ["lost-write"]
    assert "v2" in lost.anomalies[0].message and "upsert c0-1 = v2" in lost.text()
    assert kinds(check(history, {"c0-1": None})) == ["lost-write"]


def test_an_unknown_write_after_the_last_acknowledged_one_may_or_may_not_have_happened():
    history = History()
    record(history, 0, "upsert", "c0-1", 1, "ok", 1.0)
    record(history, 0, "delete", "c0-1", 2, "unknown", 2.0)
    record(history, 0, "upsert", "c0-1", 3, "unknown", 3.0)
    for state in (1, None, 3):
        assert check(history, {"c0-1": state}).ok, state
    record(history, 0, "upsert", "c0-1", 4, "ok", 4.0)
    assert kinds(check(history, {"c0-1": 3})) == ["lost-write"]  # the acknowledged v4 came after it


def test_a_refused_write_did_not_happen_and_an_acknowledged_delete_must_not_come_back():
    history = History()
    record(history, 0, "upsert", "c0-1", 1, "ok", 1.0)
    record(history, 0, "delete", "c0-1", 2, "ok", 2.0)
    record(history, 0, "upsert", "c0-1", 3, "fail", 3.0)
    assert check(history, {"c0-1": None}).ok
    assert kinds(check(history, {"c0-1": 1})) == ["resurrected-delete"]
    assert kinds(check(history, {"c0-1": 3})) == ["resurrected-delete"]


def test_a_session_read_sees_the_clients_last_write_and_never_goes_backwards():
    history = History()
    record(history, 0, "upsert", "c0-1", 1, "ok", 1.0)
    record(history, 0, "upsert", "c0-1", 2, "unknown", 2.0)
    record(history, 0, "read", "c0-1", 3, "ok", 3.0, found=2)  # the unknown write happened: fine
    record(history, 0, "read", "c0-1", 4, "ok", 4.0, found=1)  # ... and now it is gone: backwards
    report = check(history, {"c0-1": 2})
    assert kinds(report) == ["stale-session-read"]
    assert "v1" in report.anomalies[0].message and "session read c0-1 -> v1" in report.text()

    missed = History()
    record(missed, 0, "upsert", "c0-1", 1, "ok", 1.0)
    record(missed, 0, "read", "c0-1", 2, "ok", 2.0, found=None)  # its own acknowledged write missing
    assert kinds(check(missed, {"c0-1": 1})) == ["stale-session-read"]
    refused = History()
    record(refused, 0, "upsert", "c0-1", 1, "ok", 1.0)
    record(refused, 0, "read", "c0-1", 2, "fail", 2.0, found=None)  # a failed read says nothing
    assert check(refused, {"c0-1": 1}).ok


def test_an_answer_mixing_embedding_versions_and_replicas_that_differ_are_reported():
    history = History()
    record(history, 1, "query", None, 1, "ok", 1.0, versions=("v2", "v2", "v2"))
    record(history, 1, "query", None, 2, "ok", 2.0, versions=("v2", "v2", "v1"))
    history.event("partition shard-0-r0")
    report = check(history, {}, {0: {"r0": ("aa", 5), "r1": ("aa", 5)}, 1: {"r0": ("aa", 5), "r1": ("bb", 4)}})
    assert kinds(report) == ["mixed-versions", "diverged-replicas"]
    assert "shard 1" in report.anomalies[1].subject and "partition shard-0-r0" in report.text()
    assert report.counts["query:ok"] == 2
