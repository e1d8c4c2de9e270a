"""The typed shard contract, end to end: the pooled HTTP client against a real shard server
process and the in-process client against the same shard directories give the same records,
the same answers and the same errors (one contract, no string routing)."""

import asyncio
import dataclasses
import os
import sys
import time

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.bm25 import LexicalQuery
from retrieval.contract import SearchParams
from retrieval.errors import InvalidRequest, NotFound, ShardUnavailable, VersionConflict
from retrieval.fusion import WeightedFusion
from retrieval.tuning_choice import decode_queries, decode_result, encode_queries
from retrieval.types import EmbeddingVersion
from serving.local.child import Child
from serving.transport.http import HttpShardClient
from serving.transport.inprocess import InProcessShardClient
from tests.conftest import random_corpus

pytestmark = pytest.mark.slow
DIM = 16


@pytest.fixture(scope="module")
def shard_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    versions = []
    for seed in (1, 2):
        documents, vectors, _ = random_corpus(n=200, dim=DIM, seed=seed)
        version = EmbeddingVersion(f"enc{seed}", f"{seed:02d}" * 32, DIM)
        build_collection(root, documents, vectors, version, BuildConfig("c", 2), show_progress=False)
        versions.append((version.id, vectors))
    directory, _ = resolve_version(root, "c", versions[0][0])
    return directory, versions


@pytest.fixture(scope="module")
def server(shard_dirs, tmp_path_factory):
    directory, _ = shard_dirs
    child = Child("shard-1", lambda port: [sys.executable, "-m", "index_shards", "serve", "--dir",
                                           str(shard_dir(directory, 1)), "--port", str(port)],
                  tmp_path_factory.mktemp("log") / "shard-1.log")
    child.start(dict(os.environ))
    try:
        yield child.wait_ready(time.monotonic() + 60)["url"]
    finally:
        child.stop()


def both(shard_dirs, server):
    directory, _ = shard_dirs
    local, names = InProcessShardClient.of([Shard.load(shard_dir(directory, 1), device="cpu")])
    return (HttpShardClient(), server), (local, names[0][0])


def comparable(record):
    """Drop what differs between two processes by nature (pid, uptime, load time)."""
    if hasattr(record, "versions"):
        record = dataclasses.replace(record, versions=tuple(comparable(v) for v in record.versions))
    for name in ("pid", "started_at", "uptime_s", "load_s"):
        if hasattr(record, name):
            record = dataclasses.replace(record, **{name: None})
    if getattr(record, "role", None) is not None:  # names differ by nature; the role itself must not
        role = record.role
        record = dataclasses.replace(record, role=dataclasses.replace(
            role, replica="", primary="" if role.primary else None, in_sync=(), url=None))
    return record


def test_same_records_answers_and_errors_over_http_and_in_process(shard_dirs, server):
    (_, versions) = shard_dirs
    (v1, vectors1), (v2, _) = versions

    async def scenario():
        results = []
        for client, replica in both(shard_dirs, server):
            info = await client.info(replica, 5.0)
            health = await client.health(replica, 5.0)
            reply = await client.search(replica, 1, vectors1[:3], SearchParams(k=4, version=v1), 5.0)
            errors = []
            for call in (client.search(replica, 1, vectors1[:1], SearchParams(k=4, version="nope.w00.p00"), 5.0),
                         client.stage(replica, "nope.w00.p00", 5.0)):
                with pytest.raises((VersionConflict, NotFound)) as caught:
                    await call
                errors.append((type(caught.value), caught.value.field))
            staged = await client.stage(replica, v2, 5.0)
            for _ in range(100):  # loading happens in the background
                if v2 in (await client.health(replica, 5.0)).versions:
                    break
                await asyncio.sleep(0.05)
            unloaded = await client.unload(replica, v2, 5.0)
            again = await client.unload(replica, v2, 5.0)
            # the tuning calls (index_shards.live_tuning): same draws, same answers, same refusal
            queries, ids = decode_queries(await client.tune_sample(replica, v1, 5, 3, 5.0))
            evaluated = decode_result(await client.tune_evaluate(replica, v1, encode_queries(queries, ids), 4, None,
                                                                 30.0))
            with pytest.raises(InvalidRequest) as refused:  # a Flat index has no ef_search
                await client.set_search_defaults(replica, v1, {"ef_search": 8}, 5.0)
            tuning = (queries.tolist(), ids.tolist(), evaluated.knob, evaluated.exact_ids.tolist(),
                      refused.value.field)
            # the lexical search on the same seam: BM25 top k with the shard's statistics, then under them
            no_vectors = np.zeros((0, DIM), dtype=np.float32)
            lexical_params = SearchParams(k=4, version=v1, lexical=True)
            own = await client.search(replica, 1, no_vectors, lexical_params, 5.0,
                                      lexical=[LexicalQuery("Title 17 text"), LexicalQuery("text 3")])
            stats = own.stats[0]
            lexical = await client.search(replica, 1, no_vectors, lexical_params, 5.0,
                                          lexical=[LexicalQuery("Title 17 text", stats)])
            hybrid = await client.search(replica, 1, vectors1[:1], lexical_params, 5.0,
                                         lexical=[LexicalQuery("Title 17 text", stats)])  # both legs, one call
            assert hybrid.results == lexical.results and hybrid.dense == reply.results[:1]
            # a weighted hybrid on the same seam: the shard's fused top k, each hit's legs, its leg tops
            weighted = await client.search(replica, 1, vectors1[:1], lexical_params, 5.0,
                                           lexical=[LexicalQuery("Title 17 text", stats, WeightedFusion(0.5, 0.5, 6))])
            fused = weighted.results[0]
            assert len(fused["doc_ids"]) == 4 and weighted.dense is None and weighted.stats == [stats]
            assert set(fused["legs"]) == set(fused["leg_tops"]) == {"dense", "lexical"}
            assert len(fused["leg_tops"]["dense"]) == 6 and fused["scores"] == sorted(fused["scores"], reverse=True)
            # listing: every document in id order, page by page, and a filtered page with its count
            listed, after = [], ""
            while True:
                page = await client.scan(replica, 1, v1, "{}", after, 30, 5.0)
                listed.extend((r.doc_id, r.text, r.vector.tolist()) for r in page.records)
                if len(page.records) < 30:
                    break
                after = page.records[-1].doc_id
            wanted = '{"must":[{"has_id":["doc-3","doc-4","doc-5","nope"]}]}'
            filtered = await client.scan(replica, 1, v1, wanted, "doc-3", 10, 5.0)
            counted = await client.scan(replica, 1, v1, wanted, "", 0, 5.0)
            scans = (page.matches, listed, filtered.matches, [r.doc_id for r in filtered.records], counted)
            await client.close()
            results.append((comparable(info), health, reply, errors, staged.version.id, unloaded.unloaded,
                            again.unloaded, tuning, (stats, own.results, lexical.results, lexical.stats), scans,
                            fused))
        return results

    over_http, in_process = asyncio.run(scenario())
    assert over_http[0] == in_process[0] and over_http[0].shard_id == 1 and over_http[0].primary.id == v1
    assert over_http[1] == in_process[1]
    http_reply, local_reply = over_http[2], in_process[2]
    assert http_reply.version == local_reply.version == v1
    assert [r["doc_ids"] for r in http_reply.results] == [r["doc_ids"] for r in local_reply.results]
    assert np.allclose([r["scores"] for r in http_reply.results], [r["scores"] for r in local_reply.results])
    assert over_http[3] == in_process[3] == [(VersionConflict, "version"), (NotFound, "version")]
    assert over_http[4:7] == in_process[4:7] == (v2, True, False)
    assert over_http[7] == in_process[7] and len(over_http[7][0]) == 5 and over_http[7][2] is None
    assert over_http[8] == in_process[8]
    assert over_http[10]["doc_ids"] == in_process[10]["doc_ids"] and over_http[10]["legs"] == in_process[10]["legs"]
    stats, own, lexical, again = over_http[8]
    assert stats.docs == info_count(over_http[0]) and set(stats.df) == {"titl", "17", "text"}
    assert len(own) == 2 and own[0] == lexical[0] and again == [stats]  # its own statistics, given or not
    assert len(lexical) == 1 and len(lexical[0]["doc_ids"]) == 4
    assert over_http[9] == in_process[9]
    total, listed, matches, page, counted = over_http[9]
    ids = [d for d, _, _ in listed]
    assert total == len(listed) == info_count(over_http[0]) and ids == sorted(ids)
    assert matches == counted.matches and counted.records == [] and page == [d for d in ("doc-4", "doc-5")
                                                                             if d in {i for i, _, _ in listed}]


def info_count(info) -> int:
    return info.primary.count


def test_an_unreachable_replica_is_unavailable(shard_dirs):
    async def scenario():
        client = HttpShardClient()
        try:
            with pytest.raises(ShardUnavailable):
                await client.info("http://127.0.0.1:9", 1.0)
        finally:
            await client.close()

    asyncio.run(scenario())
