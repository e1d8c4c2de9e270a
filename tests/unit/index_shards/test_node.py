"""A node in-process: it hosts what the placements give it, drops the rest with its files, and
changes nothing when the cluster state cannot be read."""

from __future__ import annotations

import time

import numpy as np
import pytest

from clusterstate.collections import Collections, CollectionSpec, spec_version
from clusterstate.local import LocalKV
from index_shards.node import Node
from index_shards.server import ShardServerConfig
from retrieval.contract import SearchParams
from retrieval.errors import CoordinatorUnavailable
from retrieval.types import EmbeddingVersion


class FailingKV(LocalKV):
    failing = False

    def prefix(self, prefix):
        if self.failing:
            raise CoordinatorUnavailable("the coordinator did not answer")
        return super().prefix(prefix)


@pytest.fixture()
def node(tmp_path):
    kv = FailingKV(tmp_path / "state.json")
    made = Node(kv, "n1", tmp_path / "node", ShardServerConfig(lease_s=3.0), reconcile_s=3600)
    made.start("http://127.0.0.1:9")  # peers are never called: one replica per shard
    yield made
    made.stop()


def test_a_node_hosts_its_placements_and_drops_them_with_their_files(node):
    collections = Collections(node.kv)
    spec = collections.create(CollectionSpec("docs", dim=4, shards=2))
    node.reconcile()
    assert sorted(node.slots) == [("docs", 0), ("docs", 1)]
    served = node.slots[("docs", 0)].server.versions
    assert served.get(None).manifest.dim == 4 and served.get(None).manifest.count == 0
    empty = served.search(np.ones((1, 4), dtype=np.float32), SearchParams(k=3, version=None))
    assert len(empty.results) == 1
    files = node.root / spec.uid
    assert files.is_dir()
    collections.drop("docs")
    node.reconcile()
    assert node.slots == {} and not files.exists()


def test_an_unreadable_cluster_state_drops_nothing(node):
    Collections(node.kv).create(CollectionSpec("keep", dim=3))
    node.reconcile()
    node.kv.failing = True
    with pytest.raises(CoordinatorUnavailable):
        node.reconcile()
    assert list(node.slots) == [("keep", 0)] and any(node.root.iterdir())


def test_a_version_added_by_a_rollout_gets_an_empty_base_the_replica_can_stage(node):
    collections = Collections(node.kv)
    spec = collections.create(CollectionSpec("docs", dim=4, shards=2))
    node.reconcile()
    tuned = EmbeddingVersion(encoder_name="tuned", weights_sha256="cd" * 32, dim=6)
    collections.add_version("docs", spec.uid, tuned)
    node.reconcile()
    versions = node.slots[("docs", 1)].server.versions
    versions.stage(tuned.id)  # loads in the background; its base is the new dimension, empty
    for _ in range(200):
        if tuned.id in versions.ready_ids():
            break
        time.sleep(0.05)
    assert versions.get(tuned.id).manifest.dim == 6 and versions.get(tuned.id).manifest.count == 0
    assert versions.get(spec_version(spec).id).manifest.dim == 4  # the first version still serves
