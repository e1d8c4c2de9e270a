"""Cache-affinity routing of /v1/answer with real generator processes (SmolLM2): the same passages
go to the same generator while it is healthy, spill to others when it is over its load bound,
and fail over when it dies. The answer service is the gateway's, given a fixed retrieval."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from serving.answer.service import AnswerRequest, AnswerService, AnswerSettings
from serving.local.launcher import Child

pytestmark = pytest.mark.slow

PASSAGES = {
    f"q{n}": [{"doc_id": f"doc-{n}-{i}", "title": f"Topic {n}", "text": f"Passage {i} about topic {n}: it is short."}
              for i in range(3)]
    for n in range(4)
}


def start_generators(count: int, workdir: Path) -> list[Child]:
    children = []
    for index in range(count):
        child = Child(f"generator-{index}",
                      lambda port: [sys.executable, "-m", "serving", "generator", "--model", "smollm2", "--threads",
                                    "1", "--host", "127.0.0.1", "--port", str(port)],
                      workdir / f"generator-{index}.log")
        child.start({**os.environ, "OMP_NUM_THREADS": "1"})
        children.append(child)
    for child in children:
        child.wait_ready(time.monotonic() + 300)
    return children


@pytest.fixture()
def generators(tmp_path):
    children = start_generators(3, tmp_path)
    yield children
    for child in children:
        child.stop()


async def retrieve(query: dict) -> dict:
    return {"hits": [{**h, "score": 1.0} for h in PASSAGES[query["text"]][:query["k"]]], "version": "v1",
            "partial": False}


def run(children: list[Child], scenario, **settings: float):
    """Run ``scenario(service)`` with a fresh answer service (its HTTP client lives in this loop)."""
    async def main():
        service = AnswerService([c.ready["url"] for c in children], retrieve, settings=AnswerSettings(**settings))
        try:
            return await scenario(service)
        finally:
            await service.close()
    return asyncio.run(main())


async def ask(service: AnswerService, question: str) -> dict:
    return await service.answer(AnswerRequest(question=question, k=3, max_new_tokens=2))


def doc_ids(question: str) -> list[str]:
    return [h["doc_id"] for h in PASSAGES[question]]


def test_the_same_passages_go_to_the_same_generator_while_it_is_healthy(generators):
    async def scenario(service):
        for question in ("q0", "q1", "q2"):
            expected = service.router.preference(doc_ids(question))[0]
            served = {(await ask(service, question))["generator"] for _ in range(3)}
            assert served == {expected}, question
        assert service.router.stats.spilled == 0 and service.router.stats.failed_over == 0

    run(generators, scenario)


def test_an_overloaded_generator_spills_to_the_next(generators):
    async def scenario(service):
        preferred = service.router.preference(doc_ids("q3"))[0]
        answers = await asyncio.gather(*(ask(service, "q3") for _ in range(6)))
        served = [answer["generator"] for answer in answers]
        assert len(set(served)) >= 2, served
        assert served.count(preferred) <= 3  # the bound: ≤ ceil(1.0 × in flight / 3) while 6 are in flight
        assert service.router.stats.spilled >= 3
        # once the burst is over, the preferred generator takes the passages again
        assert (await ask(service, "q3"))["generator"] == preferred

    run(generators, scenario, load_factor=1.0)


def test_a_dead_generator_fails_over_and_is_skipped_until_it_may_be_back(generators):
    async def scenario(service):
        preferred = service.router.preference(doc_ids("q1"))[0]
        victim = next(c for c in generators if c.ready["url"] == preferred)
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait(timeout=10)
        answer = await ask(service, "q1")
        assert answer["generator"] != preferred and answer["answer"] is not None
        assert service.router.stats.failed_over == 1
        assert preferred in service.router.snapshot()["down"]
        order, _ = service.router.order(doc_ids("q1"))
        assert order[-1] == preferred  # tried last (only if every other one is down) until down_for_s passes
        again = await ask(service, "q1")
        assert again["generator"] == answer["generator"]  # the same second choice every time

    run(generators, scenario, down_for_s=60.0)
