"""A write request's fingerprint (idempotency): the same for the same request, different for another,
and — for a request that does not set ``no_vector`` — the very bytes it hashed before the field
existed, so a retry across an upgrade is still the same request."""

import hashlib
import json

from serving.writes.models import DeleteRequest, UpsertRequest
from serving.writes.plan import request_fingerprint


def test_requests_without_no_vector_fingerprint_as_before_the_field():
    body = {"documents": [{"id": "a", "text": "x", "metadata": {"n": 1}}, {"id": "b", "vector": [0.5, -1.25]}],
            "idempotency_key": "k", "write_ack": "all"}
    before = json.dumps({"documents": [
        {"id": "a", "title": "", "text": "x", "vector": None, "metadata": {"n": 1}},
        {"id": "b", "title": "", "text": None, "vector": [0.5, -1.25], "metadata": {}}], "write_ack": "all"},
        separators=(",", ":"))
    assert request_fingerprint(UpsertRequest.model_validate(body)) == hashlib.sha256(before.encode()).hexdigest()


def test_no_vector_and_content_change_the_fingerprint_the_key_does_not():
    plain = UpsertRequest.model_validate({"documents": [{"id": "a", "text": "x"}], "idempotency_key": "k1"})
    same = UpsertRequest.model_validate({"documents": [{"id": "a", "text": "x"}], "idempotency_key": "k2"})
    bare = UpsertRequest.model_validate({"documents": [{"id": "a", "text": "x", "no_vector": True}]})
    other = UpsertRequest.model_validate({"documents": [{"id": "a", "text": "y"}]})
    prints = {request_fingerprint(r) for r in (plain, bare, other)}
    assert request_fingerprint(plain) == request_fingerprint(same) and len(prints) == 3
    assert request_fingerprint(DeleteRequest.model_validate({"ids": ["a"]})) != \
        request_fingerprint(DeleteRequest.model_validate({"ids": ["b"]}))
