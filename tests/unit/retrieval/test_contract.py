"""The shard contract's records survive the JSON trip, and every error comes back as its class."""

import pytest

from retrieval.contract import (
    HealthInfo,
    ReplicaInfo,
    SearchParams,
    SearchReply,
    StageReply,
    UnloadReply,
    VersionInfo,
)
from retrieval.errors import (
    DeadlineExceeded,
    DimensionMismatch,
    EncoderError,
    GeneratorUnavailable,
    InvalidRequest,
    MalformedBody,
    NotFound,
    RateLimited,
    ResourceExhausted,
    ShardragError,
    ShardUnavailable,
    Unauthorized,
    VersionConflict,
    error_for_status,
)
from retrieval.types import EmbeddingVersion

VERSION = EmbeddingVersion("m", "ab" * 32, 4)
LOADED = VersionInfo(VERSION.id, "ready", embedding_version=VERSION, count=10, dim=4, metric="ip", factory="Flat",
                     partitioner="kmeans", num_shards=2, centroid=(0.5, 0.5, 0.0, 0.0), on_gpu=False, load_s=0.2,
                     lexical_index="building")
LOADING = VersionInfo("other.w00.p00", "loading")
BUILT = VersionInfo(VERSION.id, "ready", embedding_version=VERSION, count=10, dim=4, metric="ip", factory="Flat",
                    partitioner="kmeans", num_shards=2, lexical_index="built", lexical_index_bytes=4096,
                    lexical_index_build_s=0.25)
FAILED = VersionInfo("bad.w00.p00", "failed", error="index.faiss: checksum mismatch")


@pytest.mark.parametrize("record", [
    LOADED, LOADING, FAILED, BUILT,
    ReplicaInfo("docs", 1, 2, (LOADED, LOADING), pid=42, started_at=1.5, uptime_s=3.0),
    ReplicaInfo("docs", 0, 2, (FAILED,)),
    HealthInfo(1, (VERSION.id,)),
    StageReply(LOADING, (LOADED, LOADING)),
    UnloadReply(True, (LOADED,)),
    SearchReply(1, VERSION.id, 0.3, [{"doc_ids": ["a"], "scores": [0.9], "titles": [""], "texts": ["t"]}]),
])
def test_records_round_trip_through_their_dicts(record):
    assert type(record).from_dict(record.to_dict()) == record


def test_replica_info_reports_its_first_ready_version_at_the_top():
    info = ReplicaInfo("docs", 1, 2, (LOADING, LOADED)).to_dict()
    assert info["embedding_version"]["id"] == VERSION.id and info["count"] == 10
    assert info["centroid"] == [0.5, 0.5, 0, 0]
    assert "pid" not in info
    assert ReplicaInfo("docs", 1, 2, (FAILED,)).to_dict()["count"] is None
    assert ReplicaInfo("docs", 1, 2, (LOADING, LOADED)).ready_versions() == {VERSION.id: LOADED}


def test_search_params_query_string_names_only_what_is_set():
    assert SearchParams(k=5, version="v1").query_string() == "k=5&version=v1"
    assert SearchParams(k=5, version=None, nprobe=8, ef_search=64, with_text=False).query_string() == \
        "k=5&nprobe=8&ef_search=64&with_text=false"


def body(code: str, message: str = "m", **extra) -> bytes:
    import json

    return json.dumps({"error": {"code": code, "message": message, **extra}}).encode()


@pytest.mark.parametrize("status, payload, cls", [
    (400, body("malformed_body"), MalformedBody),
    (401, body("unauthorized"), Unauthorized),
    (404, body("not_found"), NotFound),
    (409, body("version_conflict", field="version"), VersionConflict),
    (413, body("payload_too_large"), ShardragError),
    (422, body("invalid_request", field="k"), InvalidRequest),
    (422, body("dimension_mismatch", field="vector"), DimensionMismatch),
    (429, body("rate_limited"), RateLimited),
    (503, body("shard_unavailable"), ShardUnavailable),
    (503, body("encoder_unavailable"), EncoderError),
    (503, body("generator_unavailable"), GeneratorUnavailable),
    (504, body("deadline_exceeded"), DeadlineExceeded),
    (507, body("resource_exhausted"), ResourceExhausted),
    (500, b"<html>oops</html>", ShardragError),
    (418, b"", InvalidRequest),
])
def test_error_for_status_gives_back_the_class_the_server_raised(status, payload, cls):
    error = error_for_status(status, payload, retry_after_s=2.0)
    assert type(error) is cls or (cls is ShardragError and isinstance(error, ShardragError))
    assert error.status_code == status


def test_error_for_status_keeps_field_shard_and_retry_after():
    error = error_for_status(422, body("invalid_request", "k: too big", field="k", shard=3))
    assert (error.field, error.shard, error.message) == ("k", 3, "k: too big")
    limited = error_for_status(429, body("rate_limited"), retry_after_s=7.0)
    assert isinstance(limited, RateLimited) and limited.retry_after_s == 7.0


def test_on_an_internal_hop_what_the_peer_failed_at_is_an_unavailable_replica():
    where = "http://127.0.0.1:9"
    for status, code in ((500, "internal_error"), (504, "deadline_exceeded"), (503, "shard_unavailable"),
                         (401, "unauthorized")):
        error = error_for_status(status, body(code, "boom"), peer=where, shard=1)
        assert type(error) is ShardUnavailable and error.status_code == 503 and error.shard == 1
        assert f"shard 1 ({where}) answered {status}: boom" == error.message
    conflict = error_for_status(409, body("version_conflict", "not held", field="version"), peer=where, shard=1)
    assert isinstance(conflict, VersionConflict) and conflict.message == f"shard 1 ({where}): not held"
    full = error_for_status(507, body("resource_exhausted"), peer=where)
    assert isinstance(full, ResourceExhausted)  # a replica that cannot hold another version: a refusal
