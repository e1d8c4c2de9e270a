"""Synthetic queries with a real (tiny, randomly initialised) causal LM: deterministic, cached,
resumable after an interruption, and the prompt's examples are none of the evaluation queries."""

import json

import numpy as np
import pytest

from retrieval.datasets import load_queries
from tests.conftest import data_dir
from training.synthetic_queries import (
    FEW_SHOT,
    GenerationSettings,
    QueryCache,
    QueryGenerator,
    build_prompt,
    make_tiny_generator,
    round_trip,
)

PASSAGES = [f"passage number {i} about topic {i % 3} with some words to read" for i in range(10)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_generator(tmp_path_factory.mktemp("gen") / "tiny-llama")


def generator(tiny, cache):
    return QueryGenerator(str(tiny), cache_dir=cache, settings=GenerationSettings(max_new_tokens=8, batch_size=4),
                          device="cpu")


def test_same_passages_same_queries_and_the_second_time_from_the_cache(tiny, tmp_path):
    first = generator(tiny, tmp_path / "a")
    queries = first.queries(PASSAGES)
    assert first.generated == len(PASSAGES) and len(queries) == len(PASSAGES)
    assert any(q for q in queries)
    other = generator(tiny, tmp_path / "b")  # another cache: generated again, the same
    assert other.queries(PASSAGES) == queries and other.generated == len(PASSAGES)
    again = generator(tiny, tmp_path / "a")
    assert again.queries(PASSAGES) == queries and again.generated == 0  # all from the cache


def test_an_interrupted_generation_resumes_with_what_is_missing(tiny, tmp_path):
    complete = generator(tiny, tmp_path / "ref").queries(PASSAGES)
    partial = generator(tiny, tmp_path / "c")
    partial.queries(PASSAGES[:4])
    with open(partial.cache.path, "a") as handle:  # a crash mid-write leaves a torn line
        handle.write('{"h": "abc", "q": "tor')
    resumed = generator(tiny, tmp_path / "c")
    assert len(resumed.cache.entries) == 4  # the torn line is cut off
    assert resumed.queries(PASSAGES) == complete and resumed.generated == len(PASSAGES) - 4
    lines = partial.cache.path.read_text().splitlines()
    assert len(lines) == len(PASSAGES) and all(json.loads(line) for line in lines)


def test_the_prompt_examples_are_not_evaluation_queries():
    examples = {query for _, query in FEW_SHOT}
    for name in ("msmarco", "dbpedia"):
        assert not examples & set(load_queries(data_dir() / name / "queries.jsonl").values())
    prompt = build_prompt("the passage")
    assert prompt.endswith("Document: the passage\nRelevant query:") and prompt.count("Relevant query:") == 4


def test_round_trip_keeps_a_pair_only_when_its_passage_ranks_in_the_top_k():
    passages = np.eye(4, dtype=np.float32)
    vectors = {"q0": [1, 0, 0, 0], "q1": [0.9, 0.5, 0, 0], "q2": [0, 0, 0.2, 1]}

    def encode(texts):
        return np.asarray([vectors[t] for t in texts], dtype=np.float32)

    assert round_trip(["q0", "q1", "q2"], [0, 1, 2], passages, encode, k=1) == [True, False, False]
    assert round_trip(["q0", "q1", "q2"], [0, 1, 2], passages, encode, k=2) == [True, True, True]


def test_cache_file_survives_reopen(tmp_path):
    cache = QueryCache(tmp_path / "q.jsonl")
    cache.append([("h1", "a query"), ("h2", None)])
    assert QueryCache(tmp_path / "q.jsonl").entries == {"h1": "a query", "h2": None}
