"""Per-shard document store in SQLite: int id → (doc id, title, text, metadata).

Written once at build time (journal off: the file is in a staging directory that is only
renamed into place after fsync) and opened read-only and immutable when served, so the file
whose sha256 is in the manifest is never touched again.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from retrieval.errors import IndexIntegrityError
from retrieval.types import Document

_SCHEMA = """
CREATE TABLE docs (
    int_id   INTEGER PRIMARY KEY,
    doc_id   TEXT NOT NULL UNIQUE,
    title    TEXT NOT NULL,
    text     TEXT NOT NULL,
    metadata TEXT NOT NULL
)
"""
_LOOKUP_CHUNK = 500


class StoredDoc(NamedTuple):
    """One stored document. A named tuple: a search builds k of these per shard call, and a
    frozen dataclass costs ~5× more to construct."""

    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any] | None = None  # read only when asked for


def write_docstore(path: Path, int_ids: Sequence[int], documents: Iterable[Document]) -> None:
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")  # the caller fsyncs the finished file
        connection.execute(_SCHEMA)
        connection.executemany(
            "INSERT INTO docs (int_id, doc_id, title, text, metadata) VALUES (?, ?, ?, ?, ?)",
            (
                (int(i), d.doc_id, d.title, d.text, json.dumps(dict(d.metadata), sort_keys=True))
                for i, d in zip(int_ids, documents, strict=True)
            ),
        )
        connection.commit()
    finally:
        connection.close()


class DocStore:
    """Read-only view of a shard's documents."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._connection = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
            self.count = int(self._connection.execute("SELECT COUNT(*) FROM docs").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise IndexIntegrityError(f"{path} is not a readable document store: {exc}") from exc

    def get_many(self, int_ids: Iterable[int], *, with_text: bool = True,
                 with_metadata: bool = False) -> dict[int, StoredDoc]:
        ids = list({int(i) for i in int_ids})
        columns = "int_id, doc_id, title, text" if with_text else "int_id, doc_id, '', ''"
        columns += ", metadata" if with_metadata else ", NULL"
        found: dict[int, StoredDoc] = {}
        for start in range(0, len(ids), _LOOKUP_CHUNK):
            chunk = ids[start : start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            for int_id, doc_id, title, text, metadata in self._connection.execute(
                f"SELECT {columns} FROM docs WHERE int_id IN ({marks})", chunk
            ):
                found[int_id] = StoredDoc(doc_id, title, text, json.loads(metadata) if metadata else None)
        return found

    def iter_metadata(self) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """(int id, doc id, metadata) of every document (what the payload index is built from)."""
        for int_id, doc_id, metadata in self._connection.execute(
            "SELECT int_id, doc_id, metadata FROM docs ORDER BY int_id"
        ):
            yield int_id, doc_id, json.loads(metadata)

    def iter_all(self) -> Iterator[tuple[int, StoredDoc]]:
        """Every document of the shard, by int id (a training slice reads its shard this way)."""
        for int_id, doc_id, title, text in self._connection.execute(
            "SELECT int_id, doc_id, title, text FROM docs ORDER BY int_id"
        ):
            yield int_id, StoredDoc(doc_id, title, text)

    def get_metadata(self, int_id: int) -> dict[str, Any] | None:
        row = self._connection.execute("SELECT metadata FROM docs WHERE int_id = ?", (int(int_id),)).fetchone()
        return json.loads(row[0]) if row else None

    def close(self) -> None:
        self._connection.close()
