"""Corpus, query and qrels loaders: JSONL and the BEIR folder layout.

BEIR layout: ``corpus.jsonl`` (``_id``, ``title``, ``text``, ``metadata``), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/<split>.tsv``. Qrels come with a ``query-id corpus-id score``
header or without one, and sometimes in the 4-column TREC form ``qid 0 docid rel``: all are read.
Ids stay strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import InvalidRequest
from retrieval.types import DocId, Document

Qrels = dict[str, dict[str, int]]
"""query id → {doc id → graded relevance}; grade 0 means judged not relevant."""


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"{path}:{line_no}: not valid JSON ({exc.msg})", field="corpus") from exc
            if not isinstance(record, dict):
                raise InvalidRequest(f"{path}:{line_no}: expected a JSON object", field="corpus")
            yield line_no, record


def _record_id(record: dict[str, Any], path: Path, line_no: int) -> str:
    value = record.get("_id", record.get("id", record.get("doc_id")))
    if value is None or str(value) == "":
        raise InvalidRequest(f"{path}:{line_no}: record has no '_id'", field="_id")
    return str(value)


def iter_corpus(path: str | Path) -> Iterator[Document]:
    """Documents of a JSONL corpus (BEIR fields; ``id``/``doc_id`` accepted for ``_id``)."""
    path = Path(path)
    for line_no, record in _json_lines(path):
        text = record.get("text", "")
        if not isinstance(text, str):
            raise InvalidRequest(f"{path}:{line_no}: 'text' must be a string", field="text")
        title = record.get("title") or ""
        metadata = record.get("metadata") or {}
        yield Document(DocId(_record_id(record, path, line_no)), text, str(title), dict(metadata))


def load_corpus(path: str | Path) -> list[Document]:
    documents = list(iter_corpus(path))
    seen: set[str] = set()
    for document in documents:
        if document.doc_id in seen:
            raise InvalidRequest(f"{path}: duplicate document id {document.doc_id!r}", field="_id")
        seen.add(document.doc_id)
    return documents


def load_queries(path: str | Path) -> dict[str, str]:
    path = Path(path)
    return {_record_id(record, path, line_no): str(record.get("text", "")) for line_no, record in _json_lines(path)}


def load_qrels(path: str | Path) -> Qrels:
    path = Path(path)
    qrels: Qrels = {}
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) == 3:
                query_id, doc_id, grade = parts
            elif len(parts) == 4:  # TREC: qid iteration docid rel
                query_id, _, doc_id, grade = parts
            else:
                raise InvalidRequest(f"{path}:{line_no}: expected 3 or 4 columns, got {len(parts)}", field="qrels")
            try:
                relevance = int(float(grade))
            except ValueError:
                if line_no == 1:  # the optional "query-id corpus-id score" header
                    continue
                raise InvalidRequest(f"{path}:{line_no}: relevance {grade!r} is not a number", field="qrels") from None
            qrels.setdefault(query_id, {})[doc_id] = relevance
    return qrels


@dataclass(slots=True, frozen=True)
class BeirDataset:
    name: str
    corpus: list[Document]
    queries: dict[str, str]
    qrels: Qrels

    def judged_queries(self) -> dict[str, str]:
        """Queries with at least one positive judgment (the ones BEIR evaluates)."""
        return {
            query_id: text
            for query_id, text in self.queries.items()
            if any(grade > 0 for grade in self.qrels.get(query_id, {}).values())
        }


def load_beir(folder: str | Path, split: str = "test") -> BeirDataset:
    folder = Path(folder)
    corpus_path = folder / "corpus.jsonl"
    if not corpus_path.exists():
        raise InvalidRequest(f"{folder} is not a BEIR folder: {corpus_path.name} is missing", field="corpus")
    queries_path = folder / "queries.jsonl"
    qrels_path = folder / "qrels" / f"{split}.tsv"
    return BeirDataset(
        name=folder.name,
        corpus=load_corpus(corpus_path),
        queries=load_queries(queries_path) if queries_path.exists() else {},
        qrels=load_qrels(qrels_path) if qrels_path.exists() else {},
    )


def load_documents(source: str | Path) -> list[Document]:
    """A corpus from a JSONL file or a BEIR folder."""
    source = Path(source)
    if source.is_dir():
        return load_corpus(source / "corpus.jsonl") if (source / "corpus.jsonl").exists() else load_beir(source).corpus
    if not source.exists():
        raise InvalidRequest(f"corpus {source} does not exist", field="corpus")
    return load_corpus(source)
