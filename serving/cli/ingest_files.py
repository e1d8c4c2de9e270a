"""``shardrag ingest PATH…``: folders, globs and files of Markdown, text, HTML and PDF into a
collection, idempotent by content.

Every file is read and cut first (``retrieval.passages``: by the encoder's tokens, with overlap;
heading and page kept) — anything unreadable stops the run before a single write, naming the
file. Then, per file, with ``H`` its content's sha256:

* each passage's id is ``<absolute path>#<H[:16]>:<n>`` and its metadata ``source`` (the path),
  ``ingest_root`` (the PATH argument it came from), ``file_sha256`` (``H[:16]``), ``file_type``,
  ``chunk`` (n), ``heading`` and ``page`` where there are;
* **unchanged** — the file's last passage exists with that hash: nothing is sent (a re-run makes
  no write). The last passage is written alone, after all the others were acknowledged, so its
  presence means the whole file is in;
* **without text** (nothing but white space, or a PDF of images) — nothing is written, and the
  passages an earlier version of the file left are deleted;
* **new or changed** — its passages are written (upserts by id: a run interrupted and re-run
  writes the same passages again, harmlessly), the last one alone, then the passages of the same
  ``source`` with another hash are deleted: exactly the file's old passages, none of another file;
* ``--sync`` — afterwards, passages whose ``ingest_root`` is one of this run's PATHs but whose
  ``source`` is no longer among its files are deleted (files removed since).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import ConfigError, InvalidRequest, NotFound
from retrieval.filters import MAX_VALUE_CHARS, MAX_VALUES
from retrieval.passages import SUFFIXES, Passage, file_digest, read_sections, split_sections, tokenizer_offsets
from retrieval.session import SessionFloors

MAX_ID_CHARS = 512
MAX_MUST_NOT = 16  # conditions in one filter list (docs/filters.md)
HASH_CHARS = 16


@dataclass(frozen=True, slots=True)
class FilePlan:
    path: Path
    root: str  # the PATH argument it was found under, resolved
    digest: str  # H[:16]
    passages: list[Passage]

    @property
    def source(self) -> str:
        return str(self.path)

    def passage_id(self, index: int) -> str:
        doc_id = f"{self.source}#{self.digest}:{index}"
        if len(doc_id) > MAX_ID_CHARS:  # a very long path: its hash stands for it
            doc_id = f"{hashlib.sha256(self.source.encode()).hexdigest()[:32]}#{self.digest}:{index}"
        return doc_id

    def document(self, passage: Passage) -> dict[str, Any]:
        metadata: dict[str, Any] = {"source": self.source, "ingest_root": self.root, "file_sha256": self.digest,
                                    "file_type": self.path.suffix.lower().lstrip("."), "chunk": passage.index}
        if passage.heading:
            metadata["heading"] = passage.heading[:MAX_VALUE_CHARS]
        if passage.page is not None:
            metadata["page"] = passage.page
        return {"id": self.passage_id(passage.index), "title": passage.heading or self.path.name,
                "text": passage.text, "metadata": metadata}


def found_files(arguments: list[str]) -> Iterator[tuple[Path, str]]:
    """(file, its root) for every PATH: a folder (every readable kind below it), a glob, a file."""
    for argument in arguments:
        given = Path(argument).expanduser()
        if given.is_dir():
            root = given.resolve()
            for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES):
                yield path, str(root)
        elif given.is_file():
            yield given.resolve(), str(given.resolve())
        elif glob.has_magic(argument):
            matches = sorted(Path(p).resolve() for p in glob.glob(str(given), recursive=True))
            files = [p for p in matches if p.is_file() and p.suffix.lower() in SUFFIXES]
            yield from ((path, str(Path(argument).expanduser().absolute())) for path in files)
        else:
            raise ConfigError(f"{argument}: no such file or folder", field="path")


def plan_files(arguments: list[str], max_tokens: int, overlap: int, quiet: bool) -> list[FilePlan]:
    from tqdm.auto import tqdm

    from retrieval.encoders import default_model_dir

    files = list(dict.fromkeys(found_files(arguments)))
    if not files:
        raise ConfigError(f"no file to ingest under {' '.join(arguments)} (kinds read: {', '.join(SUFFIXES)})",
                          field="path")
    tokenize = tokenizer_offsets(default_model_dir())
    plans = []
    for path, root in tqdm(files, unit="file", desc="reading", disable=quiet):
        if len(str(path)) > MAX_VALUE_CHARS or len(root) > MAX_VALUE_CHARS:
            raise InvalidRequest(f"{path}: its path is longer than {MAX_VALUE_CHARS} characters", field="path")
        passages = split_sections(read_sections(path), tokenize, max_tokens=max_tokens, overlap=overlap)
        plans.append(FilePlan(path, root, file_digest(path)[:HASH_CHARS], passages))
    return plans


def ingest_files(args: argparse.Namespace, client: Any) -> dict[str, Any]:
    """Bring the collection in line with the files; ``client``: a ShardragClient on the collection."""
    from tqdm.auto import tqdm

    plans = plan_files(args.paths, args.max_tokens, args.overlap, args.quiet)
    floors = SessionFloors()
    counts = {"files": len(plans), "unchanged": 0, "written_files": 0, "empty_files": 0, "passages_written": 0,
              "passages_deleted": 0}
    bar = tqdm(total=sum(len(p.passages) for p in plans), unit="passage", desc="ingest", disable=args.quiet)
    for plan in plans:
        if plan.passages and _is_in(client, plan):
            counts["unchanged"] += 1
            bar.update(len(plan.passages))
            continue
        documents = [plan.document(p) for p in plan.passages]
        body, last = documents[:-1], documents[-1:]
        for first in range(0, len(body), args.batch):  # the last passage alone, after every other one
            batch = body[first:first + args.batch]
            floors.note(client.upsert(batch, write_ack=args.write_ack))
            bar.update(len(batch))
        if last:
            floors.note(client.upsert(last, write_ack=args.write_ack))
            bar.update(1)
        # a file with no text writes nothing, but loses the passages an earlier version of it left
        counts["written_files" if documents else "empty_files"] += 1
        counts["passages_written"] += len(documents)
        old = {"must": [{"key": "source", "match": {"value": plan.source}}],
               "must_not": [{"key": "file_sha256", "match": {"value": plan.digest}}]}
        counts["passages_deleted"] += _delete(client, old, args.write_ack, floors)
    bar.close()
    if args.sync:
        counts["passages_deleted"] += _delete(client, _gone(plans), args.write_ack, floors)
    return {**counts, **floors.query_args()}


def _is_in(client: Any, plan: FilePlan) -> bool:
    try:
        last = client.get(plan.passage_id(len(plan.passages) - 1))
    except NotFound:
        return False
    return bool(last.get("metadata", {}).get("file_sha256") == plan.digest)


def _delete(client: Any, filter_: dict[str, Any], write_ack: str, floors: SessionFloors) -> int:
    """Delete what ``filter_`` selects, in rounds (one removes at most 100,000); how many went."""
    removed = 0
    while True:
        reply = client.delete(filter=filter_, write_ack=write_ack)
        if not reply["ids"]:
            return removed
        floors.note(reply)
        removed += len(reply["ids"])


def _gone(plans: list[FilePlan]) -> dict[str, Any]:
    """Passages under this run's roots whose file is not among this run's files."""
    roots = sorted({p.root for p in plans})
    sources = sorted({p.source for p in plans})
    chunks = [sources[i:i + MAX_VALUES] for i in range(0, len(sources), MAX_VALUES)]
    if len(roots) > MAX_VALUES or len(chunks) > MAX_MUST_NOT:
        raise ConfigError(f"--sync handles at most {MAX_VALUES * MAX_MUST_NOT} files and {MAX_VALUES} PATHs per run "
                          f"(got {len(sources)} and {len(roots)}): run it per folder", field="sync")
    return {"must": [{"key": "ingest_root", "match": {"any": roots}}],
            "must_not": [{"key": "source", "match": {"any": chunk}} for chunk in chunks]}


def report(counts: dict[str, Any]) -> None:
    empty = f", {counts['empty_files']} without text" if counts["empty_files"] else ""
    print(f"{counts['files']} files: {counts['unchanged']} unchanged, {counts['written_files']} written "
          f"({counts['passages_written']} passages){empty}, {counts['passages_deleted']} old passages deleted",
          file=sys.stderr)
    print(json.dumps(counts))
