"""The encoder service with real worker processes and the real MiniLM: its vectors are the
in-process encoder's, batched or not; a worker killed with SIGKILL under load is restarted and no
query fails."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

from retrieval.datasets import load_beir
from retrieval.encoders import encode_documents, load_default_encoder
from serving.encoding.service import EncoderService
from serving.encoding.settings import EncoderSettings
from tests.conftest import data_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
    return load_default_encoder(device="cpu")


def _queries(n: int) -> list[str]:
    return list(load_beir(data_dir() / "msmarco").queries.values())[:n]


async def _ready(service: EncoderService, version: str, timeout_s: float = 120.0):
    encoder = service.make(version, "default")
    await encoder.wait_ready(timeout_s)
    assert encoder.state == "ready", encoder.error
    return encoder


def test_worker_vectors_equal_in_process_encoding(reference, tmp_path) -> None:
    """One by one, batched, documents; a second model that cannot load fails alone."""
    texts = _queries(40)
    documents = load_beir(data_dir() / "msmarco").corpus[:24]
    expected_queries = np.stack([reference.encode_queries([t])[0] for t in texts])
    expected_docs = encode_documents(reference, documents, show_progress=False)

    async def main() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        service = EncoderService(EncoderSettings(workers=1, cache_size=0, max_wait_ms=1.0))
        service.start()
        try:
            encoder = await _ready(service, reference.version.id)
            one_by_one = np.stack([await encoder.encode(t) for t in texts])
            together = np.stack(await asyncio.gather(*(encoder.encode(t) for t in texts)))  # batched
            docs = await encoder.encode_documents(documents)
            assert service.describe()["workers"][0]["ready"] == [reference.version.id]
            broken = service.make("some-version", str(tmp_path))  # no checkpoint there: reported, not hung
            await broken.wait_ready(120)
            assert broken.state == "failed" and broken.error is not None and "checkpoint" in broken.error
            assert encoder.state == "ready" and np.array_equal(await encoder.encode(texts[0]), one_by_one[0])
            return one_by_one, together, docs
        finally:
            service.close()

    one_by_one, together, docs = asyncio.run(main())
    assert np.abs(one_by_one - expected_queries).max() <= 1e-6
    assert np.abs(together - expected_queries).max() <= 1e-6
    assert np.abs(docs - expected_docs).max() <= 1e-6


def test_a_killed_worker_is_restarted_and_no_query_fails(reference) -> None:
    """kill -9 the one worker while 4 clients send queries: every query gets its vector (its batch
    is retried on the restarted worker, within the query's deadline), and the worker comes back with
    its model."""
    texts = _queries(100)
    expected = {t: v for t, v in zip(texts, reference.encode_queries(texts), strict=True)}

    async def main() -> tuple[int, list[dict[str, object]], dict[str, int]]:
        service = EncoderService(EncoderSettings(workers=1, cache_size=0))
        service.start()
        try:
            encoder = await _ready(service, reference.version.id)
            victim = service.describe()["workers"][0]["pid"]
            done = 0
            stop = False

            async def client(offset: int) -> None:
                nonlocal done
                i = offset
                while not stop:
                    text = texts[i % len(texts)]
                    vector = await encoder.encode(text, timeout_s=60.0)
                    assert np.abs(vector - expected[text]).max() <= 1e-5
                    done += 1
                    i += 4

            clients = [asyncio.ensure_future(client(c)) for c in range(4)]
            await asyncio.sleep(1.0)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:  # until the worker is back with its model
                rows = service.describe()["workers"]
                if rows[0]["restarts"] == 1 and rows[0]["alive"] and rows[0]["ready"]:
                    break
                await asyncio.sleep(0.2)
            served_after_restart = done
            await asyncio.sleep(1.0)
            stop = True
            await asyncio.gather(*clients)  # re-raises any failed query
            assert done > served_after_restart, "no query served after the restart"
            return done, service.describe()["workers"], service.cache.stats()
        finally:
            service.close()

    done, rows, _ = asyncio.run(main())
    assert done > 20
    assert rows[0]["restarts"] == 1 and rows[0]["alive"] and rows[0]["last_exit_code"] == -signal.SIGKILL
    assert rows[0]["pid"] is not None and all(r["ready"] for r in rows)

