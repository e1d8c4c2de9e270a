"""What the framework integrations' tests share: a real local cluster that can create collections
(two node processes and a gateway without an encoder), and a fresh collection per test, dropped after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from index_shards.build import BuildConfig, build_collection
from retrieval.client import ShardragClient
from retrieval.errors import NotFound
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.conftest import random_corpus


@contextmanager
def collections_cluster(workdir: Path) -> Iterator[LocalCluster]:
    root = workdir / "root"
    docs, vectors, version = random_corpus(40, 8)
    build_collection(root, docs, vectors, version, BuildConfig("base", 1), show_progress=False)
    with LocalCluster(root, "base", replicas=1, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                      nodes=2, workdir=workdir / "work") as running:
        yield running


@contextmanager
def dropped_after(cluster: LocalCluster, prefix: str) -> Iterator[str]:
    """A new collection name; whatever the test made under it is dropped when it ends."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with ShardragClient(cluster.gateway_url) as admin:
            try:
                admin.drop_collection(name)
            except NotFound:  # the test never made it
                pass
