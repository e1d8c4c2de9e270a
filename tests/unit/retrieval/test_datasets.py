import json

import pytest

from retrieval.datasets import load_beir, load_corpus, load_documents, load_qrels
from retrieval.errors import InvalidRequest
from tests.conftest import data_dir


def test_qrels_with_and_without_header(tmp_path):
    with_header = tmp_path / "a.tsv"
    with_header.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n")
    without = tmp_path / "b.tsv"
    without.write_text("q1\td1\t1\nq1\td2\t0\n")
    trec = tmp_path / "c.tsv"
    trec.write_text("q1 0 d1 1\nq1 0 d2 0\n")
    expected = {"q1": {"d1": 1, "d2": 0}}
    assert load_qrels(with_header) == load_qrels(without) == load_qrels(trec) == expected


def test_bad_qrels_line_names_position(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("q1\td1\t1\nq2\td2\tmaybe\n")
    with pytest.raises(InvalidRequest, match=":2"):
        load_qrels(path)


def test_corpus_ids_stay_strings_and_duplicates_refused(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"_id": 12, "text": "x"}) + "\n" + json.dumps({"_id": "12", "text": "y"}) + "\n")
    with pytest.raises(InvalidRequest, match="duplicate"):
        load_corpus(path)
    path.write_text(json.dumps({"_id": 7, "title": "T", "text": "x"}) + "\n\n")
    [doc] = load_corpus(path)
    assert doc.doc_id == "7" and doc.title == "T"


def test_malformed_jsonl_names_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"_id": "a", "text": "x"}\n{not json\n')
    with pytest.raises(InvalidRequest, match=":2"):
        load_documents(path)


def test_shared_data_both_layouts():
    msmarco = load_beir(data_dir() / "msmarco")
    dbpedia = load_beir(data_dir() / "dbpedia")
    assert len(msmarco.corpus) == 5000 and len(dbpedia.corpus) == 5000
    assert len(msmarco.judged_queries()) == 43
    assert len(dbpedia.judged_queries()) == 40
    assert "query-id" not in dbpedia.qrels  # the header line is not a query
    assert any(doc.title for doc in dbpedia.corpus) and not any(doc.title for doc in msmarco.corpus)
    assert all(isinstance(doc.doc_id, str) for doc in dbpedia.corpus)
