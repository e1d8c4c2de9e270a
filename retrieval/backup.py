"""A collection's backup on disk: one snapshot file per shard and a manifest, written last.

    <dir>/shard-0.snapshot      retrieval.records.Snapshot bytes: every live document of shard 0
    <dir>/shard-1.snapshot      (id, title, text, metadata, vector) as of one seq of its primary
    <dir>/manifest.json         the collection's definition, each shard's cut (seq, term, count,
                                the file's sha256), the documents' count and digest

Each shard is cut at one seq under its write lock: the cut is consistent per shard while writes
go on. The **digest** is the collection's content, whatever its shard count: sha256 over the
sorted sha256 of every document's fingerprint (``records.document_fingerprint``, what replicas'
digests hash). A restore writes the documents back; the restored collection's digest equals the
backup's. Files are written crash-safe (temp, fsync, rename), the manifest after every snapshot.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from retrieval.atomic import atomic_write_bytes
from retrieval.errors import InvalidRequest
from retrieval.records import UPSERT, Snapshot, WalRecord, document_fingerprint

MANIFEST = "manifest.json"
FORMAT = 1


@dataclass(frozen=True, slots=True)
class ShardCut:
    shard: int
    seq: int  # the primary's applied seq the snapshot was taken at
    term: int
    count: int  # live documents in it
    file: str
    sha256: str  # of the file's bytes


@dataclass(frozen=True, slots=True)
class BackupManifest:
    collection: str
    definition: dict[str, Any]  # GET /v1/collections/{name}: dim, metric, model, version, shards, factory, ...
    shards: list[ShardCut]
    count: int
    digest: str
    created_at: str
    format: int = FORMAT
    notes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: Path) -> BackupManifest:
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise InvalidRequest(f"{where}: backup format {raw.get('format')!r}, this shardrag reads {FORMAT}",
                                     field="from")
            shards = [ShardCut(**cut) for cut in raw.pop("shards")]
            return cls(shards=shards, **raw)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidRequest(f"{where}: not a shardrag backup manifest ({exc})", field="from") from exc


def digest_of(records: Iterable[WalRecord]) -> tuple[int, str]:
    """(count, digest) of documents, in any order and spread over any number of shards."""
    hashes = sorted(hashlib.sha256(document_fingerprint(r.doc_id, r.vector, r.title, r.text, r.metadata)).digest()
                    for r in records if r.op == UPSERT)
    return len(hashes), hashlib.sha256(b"".join(hashes)).hexdigest()


def shard_file(shard: int) -> str:
    return f"shard-{shard}.snapshot"


def write_shard(directory: Path, shard: int, data: bytes) -> tuple[ShardCut, Snapshot]:
    """Check ``data`` decodes as a snapshot, write it crash-safe; its cut and the snapshot."""
    try:
        snapshot = Snapshot.decode(data)
    except ValueError as exc:
        raise InvalidRequest(f"shard {shard}'s snapshot does not decode: {exc}", field="shard") from exc
    atomic_write_bytes(directory / shard_file(shard), data)
    cut = ShardCut(shard, snapshot.seq, snapshot.term, len(snapshot.records), shard_file(shard),
                   hashlib.sha256(data).hexdigest())
    return cut, snapshot


def write_manifest(directory: Path, manifest: BackupManifest) -> None:
    atomic_write_bytes(directory / MANIFEST, manifest.to_json())


def read_backup(directory: Path) -> tuple[BackupManifest, list[Snapshot]]:
    """The manifest and every shard's snapshot, each file checked against its recorded sha256."""
    path = directory / MANIFEST
    if not path.is_file():
        raise InvalidRequest(f"{directory}: no {MANIFEST} (not a backup, or one that did not finish)", field="from")
    manifest = BackupManifest.from_json(path.read_bytes(), path)
    snapshots = []
    for cut in manifest.shards:
        data = (directory / cut.file).read_bytes()
        if hashlib.sha256(data).hexdigest() != cut.sha256:
            raise InvalidRequest(f"{directory / cut.file}: its sha256 is not the manifest's (damaged)", field="from")
        snapshots.append(Snapshot.decode(data))
    return manifest, snapshots


def documents_of(snapshots: Sequence[Snapshot]) -> list[WalRecord]:
    return [record for snapshot in snapshots for record in snapshot.records]
