"""Publish and fetch a shard as one archive, for nodes that do not share a disk.

``pack`` writes ``shard-<i>.tar.gz`` of a verified shard directory. ``fetch`` downloads one
(http(s):// or file://), unpacks it into a hidden staging directory beside the destination,
verifies every checksum against the manifest inside, fsyncs and renames it into place — so a
half-downloaded or damaged shard is never served. A destination that already holds a shard
that verifies is left alone (an init container re-run after a pod restart costs nothing).
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
import urllib.request
import uuid
from pathlib import Path

from index_shards.manifest import ShardManifest, verify_shard_dir
from retrieval.atomic import fsync_dir, fsync_tree
from retrieval.errors import ConfigError, IndexIntegrityError, ShardragError

logger = logging.getLogger(__name__)


def pack_shard(directory: str | Path, out: str | Path) -> Path:
    directory, out = Path(directory), Path(out)
    verify_shard_dir(directory)  # never publish a damaged shard
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")
    with tarfile.open(temp, "w:gz") as archive:
        for path in sorted(directory.iterdir()):
            archive.add(path, arcname=path.name)
    with open(temp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temp, out)
    fsync_dir(out.parent)
    return out


def fetch_shard(url: str, dest: str | Path, *, timeout_s: float = 600.0) -> ShardManifest:
    dest = Path(dest)
    if (dest / "manifest.json").exists():
        try:
            manifest = verify_shard_dir(dest)
            logger.info("%s already holds a verified shard; not fetching", dest)
            return manifest
        except ShardragError as exc:
            raise IndexIntegrityError(f"{dest} holds a shard that fails verification ({exc.message}); "
                                      "remove it to fetch again") from exc
    if not url.startswith(("http://", "https://", "file://")):
        raise ConfigError(f"url must be http(s):// or file://, not {url!r}", field="url")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=dest.parent))
    try:
        archive_path = staging / "shard.tar.gz"
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(archive_path, "wb") as out:  # noqa: S310
            shutil.copyfileobj(response, out, 1 << 20)
        unpacked = staging / "shard"
        unpacked.mkdir()
        with tarfile.open(archive_path, "r:*") as archive:
            archive.extractall(unpacked, filter="data")  # refuses absolute paths, links out, devices
        manifest = verify_shard_dir(unpacked)
        fsync_tree(unpacked)
        os.rename(unpacked, dest)
        fsync_dir(dest.parent)
        return manifest
    except (OSError, tarfile.TarError) as exc:
        raise IndexIntegrityError(f"cannot fetch a shard from {url}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
