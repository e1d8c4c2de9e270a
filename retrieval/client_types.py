"""What the Python clients send and get back, shared by the sync and async clients: request bodies,
the typed answer and its server-sent events, and one place that turns a non-200 into the error
tree (``check``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from retrieval.errors import GeneratorUnavailable, ShardragError, error_for_status

ROLLOUT_ACTIONS = ("stage", "activate", "retire", "abort", "rollback")


def check(status: int, content: bytes, headers: Any) -> dict[str, Any]:
    """The JSON body of a 2xx, or the shardrag error the gateway named (status → class, field)."""
    if 200 <= status < 300:
        payload: dict[str, Any] = json.loads(content)
        return payload
    raise error_for_status(status, content, retry_after_s=float(headers.get("retry-after", "1")))


def rollout_error(status: int, content: bytes) -> ShardragError:
    """A rollout refusal, with the quality gate's numbers on ``.gate`` when the gate refused."""
    error = error_for_status(status, content)
    try:
        detail = json.loads(content).get("error", {})
    except (ValueError, AttributeError):
        detail = {}
    error.gate = detail.get("gate") if isinstance(detail, dict) else None  # type: ignore[attr-defined]
    return error


def query_body(*, text: str | None, vector: Sequence[float] | None, k: int | None, top_m: int | None,
               nprobe: int | None, ef_search: int | None, timeout_ms: int | None, with_text: bool,
               version: str | None, filter: dict[str, Any] | None, with_metadata: bool,
               min_seq: dict[str, int] | None, min_term: dict[str, int] | None = None, mode: str | None = None,
               fusion: str | None = None, rrf_k: int | None = None, weights: dict[str, float] | None = None,
               candidates: int | None = None, group_by: str | None = None,
               group_size: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"with_text": with_text}
    if mode is not None:  # None: the collection's query default (dense unless set)
        body["mode"] = mode
    if with_metadata:
        body["with_metadata"] = True
    if min_seq is not None or min_term is not None:
        body["consistency"] = "session"
        for name, given in (("min_seq", min_seq), ("min_term", min_term)):
            if given is not None:
                body[name] = dict(given)
    for name, value in (("text", text), ("k", k), ("top_m", top_m), ("nprobe", nprobe), ("ef_search", ef_search),
                        ("timeout_ms", timeout_ms), ("version", version), ("filter", filter), ("fusion", fusion),
                        ("rrf_k", rrf_k), ("weights", weights), ("candidates", candidates), ("group_by", group_by),
                        ("group_size", group_size)):
        if value is not None:
            body[name] = value
    if vector is not None:
        body["vector"] = [float(x) for x in vector]
    return body


def write_body(ids: Sequence[str] | None = None, *, documents: Sequence[dict[str, Any]] | None = None,
               filter: dict[str, Any] | None = None, write_ack: str = "majority",
               idempotency_key: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"write_ack": write_ack}
    for name, value in (("documents", documents), ("ids", ids)):
        if value is not None:
            body[name] = list(value)
    if filter is not None:
        body["filter"] = filter
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    return body


def scroll_body(*, filter: dict[str, Any] | None, limit: int, offset: str | None,
                with_vectors: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"limit": limit, "with_vectors": with_vectors}
    if filter is not None:
        body["filter"] = filter
    if offset is not None:
        body["offset"] = offset
    return body


def collection_body(*, dim: int | None = None, model: str | None = None, metric: str = "ip", shards: int = 1,
                    replicas: int = 1, factory: str = "Flat", tenant_field: str | None = None,
                    max_documents: int = 0, max_rps: float = 0.0,
                    lexical_language: str | None = None, ef_construction: int | None = None,
                    query_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """``PUT /v1/collections/{name}``'s body: exactly one of ``dim`` (vector-only) and ``model``."""
    body: dict[str, Any] = {"metric": metric, "shards": shards, "replicas": replicas, "factory": factory,
                            "quotas": {"max_documents": max_documents, "max_rps": max_rps}}
    for name, value in (("dim", dim), ("model", model), ("tenant_field", tenant_field),
                        ("lexical_language", lexical_language), ("ef_construction", ef_construction),
                        ("query_defaults", query_defaults)):
        if value is not None:
            body[name] = value
    return body


def query_defaults_body(*, mode: str = "dense", fusion: str = "weighted", weights: dict[str, float] | None = None,
                        rrf_k: int = 60) -> dict[str, Any]:
    """``PUT /v1/collections/{name}/query-defaults``'s body (the whole set: what is left out is
    the plain default); also ``query_defaults`` of a create."""
    body: dict[str, Any] = {"mode": mode, "fusion": fusion, "rrf_k": rrf_k}
    if weights is not None:
        body["weights"] = dict(weights)
    return body


def rollout_body(version: str | None, body: dict[str, Any]) -> dict[str, Any]:
    """A rollout command's body: the version (left out when None: a created collection's stage
    names its version by the model) and the command's other fields."""
    return {**({"version": version} if version is not None else {}), **body}


def tune_path(data_path: str) -> str:
    """Where a collection view's tune goes (the launched collection is tuned by its name too)."""
    if not data_path.startswith("/v1/collections/"):
        raise ValueError("tune names its collection: client.collection(name).tune(...)")
    return f"{data_path}/tune"


def backup_path(data_path: str, shard: int) -> str:
    """Where a collection view's backup part of ``shard`` comes from (a backup names its collection)."""
    if not data_path.startswith("/v1/collections/"):
        raise ValueError("a backup names its collection: client.collection(name).backup_shard(...)")
    return f"{data_path}/backup/{int(shard)}"


def check_bytes(status: int, content: bytes, headers: Any) -> bytes:
    """The body of a 2xx as bytes, or the shardrag error the gateway named."""
    if 200 <= status < 300:
        return content
    raise error_for_status(status, content, retry_after_s=float(headers.get("retry-after", "1")))


def tune_body(recall: float, k: int, sample: int, max_value: int | None, dry_run: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"recall": recall, "k": k, "sample": sample, "dry_run": dry_run}
    if max_value is not None:
        body["max_value"] = max_value
    return body


def collection_path(name: str) -> str:
    from urllib.parse import quote

    return f"/v1/collections/{quote(name, safe='')}"


def answer_body(question: str, *, k: int, max_new_tokens: int, stream: bool, use_cache: bool,
                kv_reuse: str | None, recompute_fraction: float | None, timeout_ms: int | None,
                mode: str | None = None, fusion: str | None = None, group_by: str | None = None) -> dict[str, Any]:
    """``POST …/answer``'s body; ``mode`` and ``fusion``: how its passages are retrieved (as a query's;
    left out, the collection's query defaults); ``group_by``: a metadata key — the passages are the
    best of the ``k`` best groups sharing its value (``k`` different sources)."""
    body: dict[str, Any] = {"question": question, "k": k, "max_new_tokens": max_new_tokens, "stream": stream,
                            "use_cache": use_cache}
    for name, value in (("kv_reuse", kv_reuse), ("recompute_fraction", recompute_fraction),
                        ("timeout_ms", timeout_ms), ("mode", mode), ("fusion", fusion), ("group_by", group_by)):
        if value is not None:
            body[name] = value
    return body


# -- answers -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Passage:
    n: int
    doc_id: str
    title: str
    score: float | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """``POST /v1/answer``'s JSON (and the ``done`` event of a stream)."""

    answer: str
    citations: list[str]
    passages: list[Passage]
    version: str
    partial_retrieval: bool
    timings: dict[str, float]
    cache: dict[str, Any]
    generator: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Answer:
        return cls(answer=payload["answer"], citations=list(payload["citations"]),
                   passages=[Passage(p["n"], p["doc_id"], p.get("title", ""), p.get("score"))
                             for p in payload["passages"]],
                   version=payload["version"], partial_retrieval=bool(payload["partial_retrieval"]),
                   timings=dict(payload["timings"]), cache=dict(payload["cache"]), generator=payload["generator"],
                   raw=payload)


@dataclass(frozen=True, slots=True)
class RetrievalEvent:
    """First event of a stream: the passages the answer will be grounded in."""

    version: str
    retrieval_ms: float
    passages: list[Passage]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token: int
    text: str  # the new text this token added (may be empty mid-character)


@dataclass(frozen=True, slots=True)
class DoneEvent:
    answer: Answer


AnswerEvent = RetrievalEvent | TokenEvent | DoneEvent


class SSEDecoder:
    """Server-sent event lines in, typed answer events out (an ``error`` event raises)."""

    def __init__(self) -> None:
        self._event: str | None = None

    def feed(self, line: str) -> AnswerEvent | None:
        if line.startswith("event: "):
            self._event = line[7:].strip()
            return None
        if not line.startswith("data: "):
            return None
        data = json.loads(line[6:])
        name, self._event = self._event, None
        if name == "retrieval":
            return RetrievalEvent(data["version"], float(data["retrieval_ms"]),
                                  [Passage(p["n"], p["doc_id"], p.get("title", "")) for p in data["passages"]])
        if name == "token":
            return TokenEvent(int(data["token"]), data["text"])
        if name == "done":
            return DoneEvent(Answer.from_json(data))
        if name == "error":
            raise GeneratorUnavailable(str(data.get("message", "the answer stream failed")))
        return None
