"""OpenTelemetry across processes: with ``SHARDRAG_TRACING=on`` and an OTLP endpoint, one text
query through 2 shards × 2 replicas — one replica slowed by the shard server's fault injection
(600 ms, past the hedge delay's cap) so that a hedge fires — arrives at a real OTLP/HTTP
receiver as one trace: the caller's ``traceparent`` → the gateway's server span → encode,
fan-out → a call per shard → its attempts (first, hedge) → each replica's own server span;
merge. One write: the gateway → its primary's apply → the other replica's apply. And one answer:
the gateway → its generator → the generation → its KV-cache node."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.otlp import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def traced(tmp_path_factory, msmarco) -> Iterator[tuple[LocalCluster, OtlpReceiver]]:
    root = tmp_path_factory.mktemp("tracing") / "root"
    build_collection(root, msmarco.documents[:400], msmarco.vectors[:400], msmarco.version,
                     BuildConfig("traced", 2), show_progress=False)
    saved = {name: os.environ.get(name) for name in ("SHARDRAG_TRACING", "OTEL_EXPORTER_OTLP_ENDPOINT")}
    with OtlpReceiver() as receiver:
        os.environ.update(SHARDRAG_TRACING="on", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
        try:  # every process of the cluster inherits the two variables
            config = GatewayConfig.from_dict({"calls": {"balancer": "round_robin"}})
            with LocalCluster(root, "traced", replicas=2, gateway=config, workdir=tmp_path_factory.mktemp("work"),
                              generators=1, kv_nodes=1, generator_args=("--threads", "2")) as cluster:
                yield cluster, receiver
        finally:
            for name, value in saved.items():
                os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_id == parent.span_id]


def whole_trace(receiver: OtlpReceiver, trace_id: str, caller: str, name: str, count: int) -> list[ReceivedSpan]:
    """The trace's spans once the gateway's root span (the caller's child) and ``count`` spans
    named ``name`` have arrived, or whatever arrived in 20 s. Every process exports on its own
    (batches every 200 ms), so the gateway's root — which ends last, after its response — can
    arrive after the replicas' spans: waiting for those alone once read the trace without it."""
    deadline = time.monotonic() + 20
    while True:
        spans = receiver.trace(trace_id)
        rooted = any(s.parent_id == caller for s in spans)
        if (rooted and sum(s.name == name for s in spans) >= count) or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def test_one_text_query_is_one_trace_across_gateway_and_replicas_with_its_hedge(traced):
    cluster, receiver = traced
    http = httpx.Client(base_url=cluster.gateway_url, timeout=30)
    slowed = http.put("/admin/faults/0/0", json={"spec": "latency=fixed:600"})
    assert slowed.status_code == 200, slowed.text
    hedged_trace = None
    for _ in range(12):  # round robin: every other call to shard 0 goes first to the slowed replica
        trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
        reply = http.post("/v1/query", json={"text": "what is the capital of france", "k": 5},
                          headers={"traceparent": f"00-{trace_id}-{caller}-01"})
        assert reply.status_code == 200, reply.text
        if any(d.get("hedged") for d in reply.json().get("diagnostics", {}).get("per_shard", [])):
            hedged_trace = (trace_id, caller)
            break
    assert hedged_trace is not None, "no query was hedged"
    trace_id, caller = hedged_trace
    spans = whole_trace(receiver, trace_id, caller, "POST /v1/search", 3)  # the slowed replica answers 600 ms late
    (root,) = [s for s in spans if s.parent_id == caller]
    assert (root.service, root.name, root.kind) == ("shardrag-gateway", "POST /v1/query", 2)  # 2: SERVER
    assert {s.name for s in children(spans, root)} >= {"encode", "fanout"}
    (fanout,) = [s for s in children(spans, root) if s.name == "fanout"]
    calls = [s for s in children(spans, fanout) if s.name == "shard.call"]
    assert sorted(c.attributes["shardrag.shard"] for c in calls) == [0, 1]
    assert [s.name for s in children(spans, fanout)].count("merge") == 1
    (slow_call,) = [c for c in calls if c.attributes["shardrag.shard"] == 0]
    assert slow_call.attributes["shardrag.hedged"] is True
    attempts = children(spans, slow_call)
    assert sorted(a.name for a in attempts) == ["shard.attempt.first", "shard.attempt.hedge"]
    assert len({a.attributes["shardrag.replica"] for a in attempts}) == 2
    for attempt in attempts:  # each attempt's request is a server span in that replica's own process
        (served,) = children(spans, attempt)
        assert served.name == "POST /v1/search" and served.service != "shardrag-gateway" and served.kind == 2
    (other_call,) = [c for c in calls if c.attributes["shardrag.shard"] == 1]
    (attempt,) = children(spans, other_call)
    assert [s.name for s in children(spans, attempt)] == ["POST /v1/search"]
    http.delete("/admin/faults")
    http.close()


def test_one_write_is_one_trace_through_the_primary_to_its_replica(traced):
    """A write under a sampled traceparent: the gateway's server span → a write.shard span per shard
    touched → the primary's server span → primary.apply → the other replica's server span (the
    replication request carries the primary's traceparent) → replica.apply."""
    cluster, receiver = traced
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    with httpx.Client(base_url=cluster.gateway_url, timeout=30) as http:
        reply = http.post("/v1/documents", json={"documents": [{"id": "traced-write", "text": "a traced passage"}],
                                                 "write_ack": "all"},
                          headers={"traceparent": f"00-{trace_id}-{caller}-01"})
    assert reply.status_code == 200, reply.text
    spans = whole_trace(receiver, trace_id, caller, "replica.apply", 1)
    (root,) = [s for s in spans if s.parent_id == caller]
    assert (root.service, root.name) == ("shardrag-gateway", "POST /v1/documents")
    (shard_write,) = [s for s in children(spans, root) if s.name == "write.shard"]
    (primary_served,) = children(spans, shard_write)
    assert primary_served.service != "shardrag-gateway" and primary_served.kind == 2
    (primary_apply,) = [s for s in children(spans, primary_served) if s.name == "primary.apply"]
    assert primary_apply.attributes["shardrag.records"] == 1 and primary_apply.attributes["shardrag.ack"] == "all"
    (replica_served,) = children(spans, primary_apply)  # the replication request, in the other replica
    assert replica_served.kind == 2 and replica_served.name.startswith("POST /v1/writes")
    (replica_apply,) = children(spans, replica_served)
    assert replica_apply.name == "replica.apply" and replica_apply.attributes["shardrag.records"] == 1
    assert replica_apply.attributes["shardrag.shard"] == primary_apply.attributes["shardrag.shard"]


def test_an_answer_is_one_trace_through_its_generator_and_the_kv_cache_node(traced):
    """An answer under a sampled traceparent: the gateway's server span → answer.generate → the
    generator's server span → generate (its tokens and cache hits) → the KV-cache node's server
    span for the blocks it looked up there (the generating thread carries the trace). Streamed, the
    generator's span is the gateway's child directly."""
    cluster, receiver = traced
    body = {"question": "what is the capital of france", "k": 2, "max_new_tokens": 4}
    with httpx.Client(base_url=cluster.gateway_url, timeout=300) as http:
        trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
        reply = http.post("/v1/answer", json=body, headers={"traceparent": f"00-{trace_id}-{caller}-01"})
        assert reply.status_code == 200, reply.text
        # every process exports on its own: wait for the KV node's span as well as the generator's
        spans = whole_trace(receiver, trace_id, caller, "POST /v1/blocks/get", 1)
        spans = whole_trace(receiver, trace_id, caller, "generate", 1)
        (root,) = [s for s in spans if s.parent_id == caller]
        assert (root.service, root.name) == ("shardrag-gateway", "POST /v1/answer")
        (call,) = [s for s in children(spans, root) if s.name == "answer.generate"]
        (served,) = children(spans, call)
        assert (served.service, served.name, served.kind) == ("shardrag-generator", "POST /v1/generate", 2)
        (generate,) = [s for s in children(spans, served) if s.name == "generate"]
        assert generate.attributes["shardrag.prompt_tokens"] > 0 and generate.attributes["shardrag.new_tokens"] >= 1
        fetched = children(spans, generate)  # the first answer looks its blocks up on the KV node too
        assert fetched and all(s.service == "shardrag-kv" and s.name == "POST /v1/blocks/get" for s in fetched)

        trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
        with http.stream("POST", "/v1/answer", json={**body, "stream": True},
                         headers={"traceparent": f"00-{trace_id}-{caller}-01"}) as streamed:
            assert streamed.status_code == 200 and "event: done" in "".join(streamed.iter_text())
    spans = whole_trace(receiver, trace_id, caller, "generate", 1)
    (root,) = [s for s in spans if s.parent_id == caller]
    (served,) = [s for s in children(spans, root) if s.service == "shardrag-generator"]
    assert [s.name for s in children(spans, served)] == ["generate"]
