"""``shardrag backup`` and ``shardrag restore``: a collection to a directory and back
(``retrieval.backup`` holds the format; docs/backup.md).

Backup: per shard, the primary's live documents as of one seq (``GET /v1/collections/{name}/
backup/{shard}``, admin key), each written crash-safe, then the manifest — the collection's
definition, every shard's cut, the count and the content digest — last. Writes go on meanwhile.

Restore: into a collection that does not exist (made from the backup's definition: dimension,
metric, model, factory and its ef_construction, tenant field, lexical language; shards and
replicas as given or as backed up) or one that exists empty with the same dimension, metric,
model and lexical language. Every document is written back with its own vector, title, text and
metadata; then the restored collection is backed up in memory and its digest compared with the
manifest's: the restore fails loudly if they differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from retrieval.analysis import DEFAULT_LANGUAGE
from retrieval.backup import (
    BackupManifest,
    digest_of,
    documents_of,
    read_backup,
    write_manifest,
    write_shard,
)
from retrieval.errors import ConfigError, InvalidRequest, NotFound
from retrieval.records import Snapshot, WalRecord
from serving.cli.common import gateway_url

BATCH = 500


def cmd_backup(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from retrieval.client import ShardragClient

    directory = Path(args.to)
    if directory.exists() and any(directory.iterdir()):
        raise ConfigError(f"--to {directory} is not empty: a backup goes into a new or empty directory", field="to")
    directory.mkdir(parents=True, exist_ok=True)
    with ShardragClient(gateway_url(args), timeout_s=args.timeout, api_key=args.api_key) as client:
        definition = client.get_collection(args.collection)
        if definition.get("default"):
            raise ConfigError(f"{args.collection!r} is the collection the cluster was launched with; backup copies "
                              "collections made through the collections API (shardrag collections create)",
                              field="collection")
        view = client.collection(args.collection)
        cuts, snapshots = [], []
        for shard in tqdm(range(int(definition["shards"])), unit="shard", desc="backup", disable=args.quiet):
            cut, snapshot = write_shard(directory, shard, view.backup_shard(shard))
            cuts.append(cut)
            snapshots.append(snapshot)
    count, digest = digest_of(documents_of(snapshots))
    manifest = BackupManifest(args.collection, definition, cuts, count, digest,
                              time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_manifest(directory, manifest)
    print(json.dumps({"collection": args.collection, "to": str(directory), "documents": count, "digest": digest,
                      "cut": {str(c.shard): c.seq for c in cuts}}))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from retrieval.client import ShardragClient

    manifest, snapshots = read_backup(Path(args.source))
    records = documents_of(snapshots)
    with ShardragClient(gateway_url(args), timeout_s=args.timeout, api_key=args.api_key) as client:
        _prepare(client, args, manifest.definition)
        view = client.collection(args.collection)
        bar = tqdm(total=len(records), unit="doc", desc=f"restore → {args.collection}", disable=args.quiet)
        for first in range(0, len(records), BATCH):
            batch = records[first:first + BATCH]
            view.upsert([_document(r) for r in batch], write_ack="all")
            bar.update(len(batch))
        bar.close()
        shards = int(client.get_collection(args.collection)["shards"])
        restored = [Snapshot.decode(view.backup_shard(shard)) for shard in range(shards)]
    count, digest = digest_of(documents_of(restored))
    result = {"collection": args.collection, "from": args.source, "documents": count, "digest": digest,
              "backup_digest": manifest.digest, "equal": digest == manifest.digest}
    print(json.dumps(result))
    if digest != manifest.digest:
        print(f"error: the restored collection's digest {digest} is not the backup's {manifest.digest} "
              f"({count} documents, the backup holds {manifest.count})", file=sys.stderr)
        return 1
    return 0


def _prepare(client: Any, args: argparse.Namespace, definition: dict[str, Any]) -> None:
    """Create the target from the backup's definition, or check the existing one is empty and alike."""
    try:
        existing = client.get_collection(args.collection)
    except NotFound:
        shape = {"shards": args.shards or int(definition["shards"]),
                 "replicas": args.replicas or int(definition.get("replicas", 1)),
                 "metric": definition["metric"], "factory": definition.get("factory", "Flat"),
                 "tenant_field": definition.get("tenant_field"),
                 "lexical_language": definition.get("lexical_language"),  # None: a backup from before it
                 "ef_construction": definition.get("ef_construction")}
        if definition.get("model"):
            client.create_collection(args.collection, model=definition["model"], **shape)
        else:
            client.create_collection(args.collection, dim=int(definition["dim"]), **shape)
        return
    alike = {"lexical_language": DEFAULT_LANGUAGE}  # what a definition without it means
    for name in ("dim", "metric", "model", "lexical_language"):
        if existing.get(name, alike.get(name)) != definition.get(name, alike.get(name)):
            raise InvalidRequest(f"collection {args.collection!r} has {name} {existing.get(name)!r}; the backup "
                                 f"is of {name} {definition.get(name)!r}: restore into a new collection, or one "
                                 "made alike", field=name)
    if int(existing.get("documents", 0)):
        raise InvalidRequest(f"collection {args.collection!r} holds {existing['documents']} documents: a restore "
                             "goes into a new or empty collection", field="collection")


def _document(record: WalRecord) -> dict[str, Any]:
    document: dict[str, Any] = {"id": record.doc_id, "title": record.title or "", "metadata": dict(record.metadata)}
    if record.vector is not None:
        document["vector"] = [float(x) for x in record.vector]
    else:  # stored without a vector: restored without one
        document["no_vector"] = True
    if (record.text or "").strip():
        document["text"] = record.text
    return document


def add_backup_commands(commands: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="gateway URL [env SHARDRAG_URL, default http://127.0.0.1:8000]")
    common.add_argument("--api-key", default=None, help="an admin key [env SHARDRAG_API_KEY]")
    common.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    common.add_argument("--quiet", action="store_true", help="no progress bar")
    backup = commands.add_parser(
        "backup", parents=[common], help="copy a collection into a directory (consistent per shard; writes go on)",
        description="Copy every shard of a collection — its live documents (vectors, titles, texts, metadata) as "
                    "of one seq of its primary — and the collection's definition into a new directory; the "
                    "manifest, written last, records each shard's cut and the content digest. Needs an admin key.")
    backup.add_argument("--collection", required=True, help="the collection to copy")
    backup.add_argument("--to", required=True, help="a new or empty directory")
    backup.set_defaults(func=cmd_backup)
    restore = commands.add_parser(
        "restore", parents=[common], help="write a backup into a new or empty collection, then check its digest",
        description="Write every document of a backup into a collection that does not exist (made from the "
                    "backup's definition) or exists empty with the same dimension, metric and model, then check "
                    "the restored content digest equals the backup's (exit 1 if not). Needs an admin key.")
    restore.add_argument("--from", dest="source", required=True, help="a directory written by shardrag backup")
    restore.add_argument("--collection", required=True, help="the collection to restore into")
    restore.add_argument("--shards", type=int, default=None, help="shards of a new collection (default: as backed up)")
    restore.add_argument("--replicas", type=int, default=None,
                         help="replicas of a new collection (default: as backed up)")
    restore.set_defaults(func=cmd_restore)
