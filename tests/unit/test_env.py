"""retrieval.env: the one reader of SHARDRAG_* — and nobody else reads them."""

import re
from pathlib import Path

import pytest

from retrieval import env
from retrieval.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_reads_listed_variables_only():
    assert env.read("SHARDRAG_URL", "d", {"SHARDRAG_URL": "http://x"}) == "http://x"
    assert env.read("SHARDRAG_URL", "d", {"SHARDRAG_URL": ""}) == "d"  # empty means unset
    with pytest.raises(KeyError, match="not a shardrag environment variable"):
        env.read("SHARDRAG_NOPE", env={})


def test_secrets_come_from_the_variable_or_its_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    assert env.internal_token({"SHARDRAG_INTERNAL_TOKEN_FILE": str(token)}) == "s3cret"
    assert env.internal_token({"SHARDRAG_INTERNAL_TOKEN": "direct", "SHARDRAG_INTERNAL_TOKEN_FILE": str(token)}) == \
        "direct"
    with pytest.raises(ConfigError, match="SHARDRAG_INTERNAL_TOKEN_FILE"):
        env.internal_token({"SHARDRAG_INTERNAL_TOKEN_FILE": str(tmp_path / "missing")})
    keys = tmp_path / "keys"
    keys.write_text("# comment\nadmin:aaaaaaaaaaaaaaaaaaaa\n\n")
    given = {"SHARDRAG_API_KEYS": "read:bbbbbbbbbbbbbbbbbbbb", "SHARDRAG_API_KEYS_FILE": str(keys)}
    assert env.api_key_entries(given) == ["read:bbbbbbbbbbbbbbbbbbbb", "admin:aaaaaaaaaaaaaaaaaaaa"]


def test_tls_needs_both_files(tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    assert env.tls_files({}) is None
    with pytest.raises(ConfigError, match="both"):
        env.tls_files({"SHARDRAG_TLS_CERT": str(cert)})
    with pytest.raises(ConfigError, match="does not exist"):
        env.tls_files({"SHARDRAG_TLS_CERT": str(cert), "SHARDRAG_TLS_KEY": str(tmp_path / "nope")})


def test_no_other_module_reads_a_shardrag_variable():
    # reads, not writes: a launcher may set a child's variables
    reading = re.compile(r"""(environ\.get|getenv)\(\s*["']SHARDRAG_"""
                         r"""|environ\[\s*["']SHARDRAG_[A-Z_]+["']\](?!\s*=(?!=))""")
    offenders = []
    for package in ("retrieval", "httpkit", "index_shards", "serving", "training", "benchmarks", "tests"):
        for path in (REPO / package).rglob("*.py"):
            if path.name != "env.py" and reading.search(path.read_text(encoding="utf-8")):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_every_variable_the_code_names_is_listed():
    named = set()
    for package in ("retrieval", "httpkit", "index_shards", "serving", "training"):
        for path in (REPO / package).rglob("*.py"):
            named |= set(re.findall(r"env\.read(?:_secret)?\(\s*\"(SHARDRAG_[A-Z_]+)\"", path.read_text()))
    assert named and named <= set(env.VARIABLES)
