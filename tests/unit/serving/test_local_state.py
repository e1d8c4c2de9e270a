"""A local start refuses replicas that cannot hold every acknowledged write: when none of the
replicas it would run is in a shard's in-sync set, the shard could never elect a primary (or, with
one replica and no election, would serve a history that lacks acknowledged writes)."""

from __future__ import annotations

import tempfile
from dataclasses import replace

import pytest

from clusterstate import open_coordinator
from clusterstate.state import ClusterState
from index_shards.build import BuildConfig, build_collection
from retrieval.errors import ConfigError, NotFound
from serving.gateway.config import GatewayConfig
from serving.local.embedded import EmbeddedCluster
from serving.local.launcher import LocalCluster
from serving.local.state import refuse_without_in_sync_replicas, with_collection_state
from tests.conftest import random_corpus


@pytest.fixture
def served(tmp_path):
    documents, vectors, version = random_corpus(60, 16)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 2), show_progress=False)
    config = with_collection_state(GatewayConfig(), tmp_path, "c")
    state = ClusterState(open_coordinator(config.cluster.coordinator), "c")
    # as a 2-replica run leaves it when replica 1 was the last primary of shard 1
    state.update_shard(0, lambda r: replace(r, term=2, primary="shard-0-r0", in_sync=("shard-0-r0", "shard-0-r1"),
                                            replicas=("shard-0-r0", "shard-0-r1")))
    state.update_shard(1, lambda r: replace(r, term=3, primary="shard-1-r1", in_sync=("shard-1-r1",),
                                            replicas=("shard-1-r0", "shard-1-r1")))
    return tmp_path, config


def test_one_replica_is_refused_when_only_replica_1_is_in_sync(served):
    root, config = served
    with pytest.raises(ConfigError) as raised:
        refuse_without_in_sync_replicas(config, root, "c", 2, 1)
    assert raised.value.field == "replicas"
    assert "shard 1" in raised.value.message and "shard-1-r1" in raised.value.message
    assert "--replicas 2" in raised.value.message
    refuse_without_in_sync_replicas(config, root, "c", 2, 2)  # both replicas: replica 1 rejoins


def test_launchers_refuse_before_starting_anything_and_release_the_collection(served):
    root, config = served
    with pytest.raises(ConfigError, match="shard-1-r1"):
        EmbeddedCluster(root, "c", gateway=config).start(progress=False)
    with pytest.raises(ConfigError, match="shard-1-r1"):
        LocalCluster(root, "c", replicas=1, gateway=config).start()
    EmbeddedCluster(root, "c", gateway=config, writable=False).start(progress=False).stop()  # reads only: fine


def test_a_launch_refused_or_failed_leaves_no_temporary_dir(served, tmp_path_factory, monkeypatch):
    """Without a workdir, a LocalCluster logs to a temporary dir of its own: a start that never got
    that far (no such version or collection, replicas refused) must not leave it behind."""
    root, config = served
    scratch = tmp_path_factory.mktemp("scratch")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(NotFound) as missing:
        LocalCluster(root, "c", version="v-nope", gateway=config)
    assert missing.value.field == "version"
    with pytest.raises(NotFound):
        LocalCluster(root, "nope", gateway=config)
    with pytest.raises(ConfigError, match="shard-1-r1"):
        LocalCluster(root, "c", replicas=1, gateway=config).start()
    assert list(scratch.iterdir()) == []


def test_a_new_collection_or_an_unrecorded_shard_starts(tmp_path):
    documents, vectors, version = random_corpus(60, 16)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 2), show_progress=False)
    config = with_collection_state(GatewayConfig(), tmp_path, "c")
    refuse_without_in_sync_replicas(config, tmp_path, "c", 2, 1)
