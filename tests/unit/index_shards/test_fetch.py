"""Publishing a shard as an archive and fetching it: verified before it appears, atomic, idempotent."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.fetch import fetch_shard, pack_shard
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.errors import ConfigError, IndexIntegrityError
from tests.conftest import random_corpus


@pytest.fixture()
def shard0(tmp_path) -> Path:
    documents, vectors, version = random_corpus(200)
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("c", 2), show_progress=False)
    version_dir, _ = resolve_version(tmp_path / "root", "c", None)
    return shard_dir(version_dir, 0)


def test_pack_then_fetch_gives_a_servable_verified_shard(shard0, tmp_path):
    archive = pack_shard(shard0, tmp_path / "pub" / "shard-0.tar.gz")
    dest = tmp_path / "node" / "shard-0"
    manifest = fetch_shard(archive.as_uri(), dest)
    assert manifest.shard_id == 0 and Shard.load(dest).manifest.shard_id == 0
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    assert fetch_shard("file:///nonexistent", dest).shard_id == 0  # already there and verified: no download


def test_a_damaged_archive_is_refused_and_nothing_appears(shard0, tmp_path):
    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(shard0.iterdir()):
            data = path.read_bytes()
            if path.name == "docs.sqlite":
                data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
            info = tarfile.TarInfo(path.name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dest = tmp_path / "node" / "shard-0"
    with pytest.raises(IndexIntegrityError, match="docs.sqlite"):
        fetch_shard(archive.as_uri(), dest)
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_an_archive_escaping_its_directory_is_refused(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(IndexIntegrityError):
        fetch_shard(archive.as_uri(), tmp_path / "node" / "shard-0")
    assert not (tmp_path / "node" / "escaped").exists()


def test_bad_urls_and_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="url"):
        fetch_shard("ftp://x/shard.tar.gz", tmp_path / "d")
    with pytest.raises(IndexIntegrityError, match="cannot fetch"):
        fetch_shard((tmp_path / "missing.tar.gz").as_uri(), tmp_path / "d")
