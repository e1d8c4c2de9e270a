"""``shardrag ingest`` and ``shardrag delete``: writes into a running cluster through its gateway.

``shardrag ingest PATH…`` reads files (Markdown, text, HTML, PDF) into passages and keeps the
collection in line with them, idempotent by content (``serving.cli.ingest_files``). With
``--corpus FILE.jsonl`` it streams a JSONL corpus (``_id``/``id``, ``title``, ``text`` or ``vector``, ``metadata``) in
batches. It is resumable: after each acknowledged batch the number of documents acknowledged is
recorded (crash-safe) in a progress file keyed by the collection and the corpus' content hash,
and a re-run starts after them. Every batch carries an idempotency key derived from the same
hash and the batch's position, so a batch that was sent but whose acknowledgement was lost is
answered from the gateway's memory of it when it is sent again — never applied twice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from retrieval import env
from retrieval.atomic import atomic_write_bytes
from retrieval.errors import ConfigError, InvalidRequest
from serving.cli.common import count_argument, gateway_url
from serving.cli.remote import _json_argument


def _corpus_hash(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _documents(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise InvalidRequest(f"{path}:{line_no}: not JSON ({exc})", field="corpus") from exc
            if not isinstance(record, dict):
                raise InvalidRequest(f"{path}:{line_no}: a record must be a JSON object", field="corpus")
            doc_id = record.get("_id", record.get("id", record.get("doc_id")))
            if doc_id is None:
                raise InvalidRequest(f"{path}:{line_no}: record has no '_id' (or 'id')", field="_id")
            document: dict[str, Any] = {"id": str(doc_id), "title": str(record.get("title") or "")}
            if record.get("vector") is not None:
                document["vector"] = record["vector"]
            else:
                document["text"] = str(record.get("text") or "")
            if record.get("metadata"):
                document["metadata"] = record["metadata"]
            yield document


def progress_path(args: argparse.Namespace, collection: str, corpus_hash: str) -> Path:
    if args.progress:
        return Path(args.progress)
    base = Path(env.read("SHARDRAG_CACHE_DIR") or Path.home() / ".cache" / "shardrag" / "embeddings").parent
    return base / "ingest" / f"{collection}-{corpus_hash[:16]}.json"


def cmd_ingest(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from retrieval.client import ShardragClient

    if bool(args.paths) == (args.corpus is not None):
        raise ConfigError("give files or folders (PATH…) or --corpus FILE.jsonl, not both", field="corpus")
    if args.batch < 1 or args.batch > 1000:
        raise ConfigError("--batch must be between 1 and 1000", field="batch")
    if args.paths:
        from serving.cli.ingest_files import ingest_files, report

        with ShardragClient(gateway_url(args), timeout_s=args.timeout, api_key=args.api_key,
                            retries=args.retries) as client:
            report(ingest_files(args, client.collection(args.collection)))
        return 0
    if args.sync:
        raise ConfigError("--sync is for files and folders (PATH…), not --corpus", field="sync")
    corpus = Path(args.corpus)
    if not corpus.is_file():
        raise ConfigError(f"--corpus {corpus} is not a file", field="corpus")
    corpus_hash = _corpus_hash(corpus)
    with ShardragClient(gateway_url(args), timeout_s=args.timeout, api_key=args.api_key,
                        retries=args.retries) as client:
        serving = client.cluster().get("collection")
        if serving != args.collection:
            raise ConfigError(f"the gateway at {gateway_url(args)} serves collection {serving!r}, not "
                              f"{args.collection!r}", field="collection")
        progress_file = progress_path(args, args.collection, corpus_hash)
        done = 0
        if progress_file.exists() and not args.restart:
            done = int(json.loads(progress_file.read_text())["acknowledged"])
        total = sum(1 for _ in _documents(corpus))
        if done:
            print(f"resuming: {done} of {total} documents were acknowledged before ({progress_file})", file=sys.stderr)
        progress_file.parent.mkdir(parents=True, exist_ok=True)
        bar = tqdm(total=total, initial=done, unit="doc", desc=f"ingest → {args.collection}", disable=args.quiet)
        batch: list[dict[str, Any]] = []
        position = 0
        seq: dict[str, int] = {}
        term: dict[str, int] = {}  # with seq: a later session read's min_term

        def send(batch: list[dict[str, Any]], first: int) -> None:
            key = f"ingest:{args.collection}:{corpus_hash[:32]}:{first}:{len(batch)}"
            reply = client.upsert(batch, write_ack=args.write_ack, idempotency_key=key)
            for shard, value in reply["seq"].items():
                seq[shard] = max(seq.get(shard, 0), int(value))
                term[shard] = max(term.get(shard, 0), int(reply.get("term", {}).get(shard, 0)))
            atomic_write_bytes(progress_file, json.dumps({
                "collection": args.collection, "corpus": str(corpus.resolve()), "sha256": corpus_hash,
                "acknowledged": first + len(batch), "total": total}).encode())
            bar.update(len(batch))

        for document in _documents(corpus):
            position += 1
            if position <= done:
                continue
            batch.append(document)
            if len(batch) == args.batch:
                send(batch, position - len(batch))
                batch = []
        if batch:
            send(batch, position - len(batch))
        bar.close()
    print(json.dumps({"collection": args.collection, "acknowledged": total, "sent": total - done, "seq": seq,
                      "term": term}))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from retrieval.client import ShardragClient

    if (args.ids is None) == (args.filter is None):
        raise ConfigError("give exactly one of --ids and --filter", field="ids")
    ids = [i for i in args.ids.split(",") if i] if args.ids is not None else None
    filter_ = _json_argument(args.filter, "--filter") if args.filter is not None else None
    with ShardragClient(gateway_url(args), timeout_s=args.timeout, api_key=args.api_key,
                        retries=args.retries) as client:
        target = client.collection(args.collection) if args.collection else client
        reply = target.delete(ids, filter=filter_, write_ack=args.write_ack)
    print(json.dumps(reply))
    return 0


INGEST_DESCRIPTION = """\
shardrag ingest PATH… --collection NAME [--sync]
  Reads folders, globs and files of Markdown, text, HTML and PDF, cuts them into
  passages by the encoder's tokens (with overlap; source path, page and heading
  kept as metadata) and upserts them. Idempotent by content: a re-run sends
  nothing for unchanged files; a changed file's passages replace exactly its old
  ones; --sync deletes the passages of files under these PATHs that are gone.
  Any unreadable file stops the run before a write, naming the file.

shardrag ingest --corpus FILE.jsonl --collection NAME
  Upserts every document of a JSONL corpus (_id/id, title, text or vector,
  metadata) in batches. Re-running after an interruption skips what was
  acknowledged; a batch re-sent after a lost acknowledgement is never applied
  twice."""


def add_write_commands(commands: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="gateway URL [env SHARDRAG_URL, default http://127.0.0.1:8000]")
    common.add_argument("--api-key", default=None, help="a key with the write scope [env SHARDRAG_API_KEY]")
    common.add_argument("--write-ack", choices=("one", "majority", "all"), default="majority",
                        help="replicas of each touched shard that must have fsynced a batch (default majority)")
    common.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    common.add_argument("--retries", type=count_argument, default=3,
                        help="how many more times a request is sent where that is safe — a refused connection, "
                             "a 429 after its Retry-After, a 503 or a lost connection (every upsert carries an "
                             "idempotency key, so it is applied once) (default 3; 0: never)")

    ingest = commands.add_parser(
        "ingest", parents=[common],
        help="files and folders (Markdown, text, HTML, PDF), or a JSONL corpus, into a running cluster",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=INGEST_DESCRIPTION)
    ingest.add_argument("paths", nargs="*", metavar="PATH", help="folders, globs or files to read")
    ingest.add_argument("--collection", required=True,
                        help="the collection to write (a text collection; with --corpus: the one the gateway "
                             "serves, checked)")
    ingest.add_argument("--sync", action="store_true",
                        help="PATH…: also delete passages of files under these PATHs that are gone")
    ingest.add_argument("--max-tokens", type=int, default=200,
                        help="PATH…: tokens per passage, of the encoder's tokenizer (default 200; MiniLM reads 256)")
    ingest.add_argument("--overlap", type=int, default=32,
                        help="PATH…: tokens a passage shares with the next (default 32)")
    ingest.add_argument("--corpus", default=None, help="a JSONL file, one document per line (instead of PATH…)")
    ingest.add_argument("--batch", type=int, default=256, help="documents per request, 1..1000 (default 256)")
    ingest.add_argument("--progress", default=None,
                        help="--corpus: progress file (default ~/.cache/shardrag/ingest/<collection>-<hash>.json)")
    ingest.add_argument("--restart", action="store_true",
                        help="--corpus: ignore earlier progress and send everything again")
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
    ingest.set_defaults(func=cmd_ingest)

    delete = commands.add_parser("delete", parents=[common], help="delete documents by id or by metadata filter",
                                 description="Delete documents from a running cluster: --ids a,b,c or --filter JSON "
                                             "(every live document it selects; docs/filters.md).")
    delete.add_argument("--ids", default=None, help="comma-separated document ids")
    delete.add_argument("--filter", default=None, help="a filter as JSON, or @FILE")
    delete.add_argument("--collection", default=None,
                        help="a collection the gateway serves (default: the collection it was started with)")
    delete.set_defaults(func=cmd_delete)
