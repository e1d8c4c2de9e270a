"""The answer service alone: it is given a retrieve function, never the gateway."""

import asyncio
import re

import pytest

from retrieval.errors import GeneratorUnavailable, InvalidRequest, ShardUnavailable
from serving.answer.service import AnswerRequest, AnswerService, retrieval_query

HITS = {"hits": [{"doc_id": "d1", "title": "T", "text": "passage", "score": 0.5}], "version": "v", "partial": False}


def test_without_generators_the_answer_is_a_503_naming_the_generator_not_the_encoder():
    asked = []

    async def retrieve(query):
        asked.append(query["text"])
        return HITS

    async def scenario():
        service = AnswerService([], retrieve)
        try:
            with pytest.raises(GeneratorUnavailable) as caught:
                await service.answer(AnswerRequest(question="why?"))
        finally:
            await service.close()
        return caught.value

    error = asyncio.run(scenario())
    assert error.status_code == 503 and error.code == "generator_unavailable" and isinstance(error, ShardUnavailable)
    assert "generator" in error.message and asked == []  # refused before retrieving anything


def test_unreachable_generators_are_tried_in_order_then_reported():
    asked = []

    async def retrieve(query):
        asked.append((query.get("mode"), query.get("fusion")))
        return HITS

    async def scenario():
        service = AnswerService(["http://127.0.0.1:9", "http://127.0.0.1:10"], retrieve)
        try:
            with pytest.raises(GeneratorUnavailable) as caught:
                await service.answer(AnswerRequest(question="why?", mode="hybrid", fusion="weighted"))
        finally:
            await service.close()
        return caught.value.message

    message = asyncio.run(scenario())
    assert "127.0.0.1:9" in message and "127.0.0.1:10" in message
    assert asked == [("hybrid", "weighted")]  # the request's retrieval mode reaches the retrieve function


def test_the_retrieval_query_carries_what_the_answer_request_named_and_nothing_else():
    assert retrieval_query(AnswerRequest(question="why?")) == {"text": "why?", "k": 3, "timeout_ms": None}
    named = AnswerRequest(question="why?", k=5, timeout_ms=900, mode="hybrid", fusion="rrf", group_by="source")
    assert retrieval_query(named) == {"text": "why?", "k": 5, "timeout_ms": 900, "mode": "hybrid", "fusion": "rrf",
                                      "group_by": "source"}


def test_a_fusion_without_a_hybrid_retrieval_is_refused_naming_it():
    asked = []

    async def retrieve(query):
        asked.append((query.get("mode"), query.get("fusion")))
        return HITS

    async def scenario(request):
        service = AnswerService(["http://127.0.0.1:9"], retrieve)
        try:
            with pytest.raises(InvalidRequest) as caught:
                await service.answer(request)
        finally:
            await service.close()
        return caught.value

    # a fusion asked for with another mode would be a retrieval its sender thinks hybrid
    error = asyncio.run(scenario(AnswerRequest(question="why?", mode="lexical", fusion="weighted")))
    assert error.status_code == 422 and error.field == "fusion" and "hybrid" in error.message
    assert asked == []  # refused before retrieving anything

    async def unnamed(request):
        service = AnswerService(["http://127.0.0.1:9"], retrieve)
        try:
            with pytest.raises(GeneratorUnavailable):  # none there; what retrieval was asked is the point
                await service.answer(request)
        finally:
            await service.close()

    # no mode named: the collection's query defaults decide (the query service refuses a fusion
    # its defaults do not make hybrid: tests/unit/serving/test_query_defaults.py)
    asyncio.run(unnamed(AnswerRequest(question="why?", fusion="rrf")))
    asyncio.run(unnamed(AnswerRequest(question="why?")))
    assert asked == [(None, "rrf"), (None, None)]


@pytest.mark.parametrize("question", [" \n", "\x1f", "\ufeff"])
def test_a_blank_question_is_refused_naming_it_as_the_schema_says(question):
    asked = []

    async def retrieve(query):
        asked.append(query["text"])
        return HITS

    async def scenario():
        service = AnswerService(["http://127.0.0.1:9"], retrieve)
        try:
            with pytest.raises(InvalidRequest) as caught:
                await service.answer(AnswerRequest(question=question))
        finally:
            await service.close()
        return caught.value

    error = asyncio.run(scenario())
    assert error.status_code == 422 and error.field == "question" and asked == []
    pattern = AnswerRequest.model_json_schema()["properties"]["question"]["pattern"]
    assert re.search(pattern, question) is None  # the schema refuses it too
    assert re.search(pattern, "why?") is not None
