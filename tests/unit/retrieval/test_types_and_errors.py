import pytest

from retrieval.errors import validation_error_body
from retrieval.types import EmbeddingVersion, Preprocessing


def test_version_id_covers_name_weights_and_preprocessing():
    base = EmbeddingVersion("all-MiniLM-L6-v2", "ab" * 32, 384)
    assert base.id.startswith("all-MiniLM-L6-v2.wabababab")
    assert EmbeddingVersion("all-MiniLM-L6-v2", "cd" * 32, 384).id != base.id
    assert EmbeddingVersion("other", "ab" * 32, 384).id != base.id
    assert EmbeddingVersion("all-MiniLM-L6-v2", "ab" * 32, 384, Preprocessing(max_tokens=128)).id != base.id
    assert EmbeddingVersion.from_dict(base.to_dict()) == base


def test_version_from_dict_refuses_inconsistent_id():
    data = EmbeddingVersion("m", "ab" * 32, 8).to_dict()
    data["weights_sha256"] = "cd" * 32
    with pytest.raises(ValueError, match="does not match"):
        EmbeddingVersion.from_dict(data)


def test_validation_errors_name_the_field():
    status, body = validation_error_body([{"loc": ("body", "k"), "msg": "too small", "type": "greater_than_equal"}])
    assert status == 422 and body["error"]["field"] == "k"
    status, body = validation_error_body([{"loc": (), "msg": "EOF", "type": "json_invalid"}])
    assert status == 400 and body["error"]["field"] == "body"
    status, body = validation_error_body([{"loc": ("bogus",), "msg": "extra", "type": "extra_forbidden"}])
    assert status == 422 and "unknown field 'bogus'" in body["error"]["message"]
