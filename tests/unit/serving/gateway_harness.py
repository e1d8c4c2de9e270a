"""An in-process gateway over real FAISS shards (no network), driven through its HTTP API."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.types import Document, EmbeddingVersion
from serving.encoding.settings import EncoderSettings
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig
from serving.gateway.factory import GatewaySetup
from serving.transport.inprocess import InProcessShardClient


def build(root: Path, name: str, documents: list[Document], vectors: np.ndarray, version: EmbeddingVersion,
          num_shards: int, partitioner: str, factory: str = "Flat") -> list[Shard]:
    build_collection(root, documents, vectors, version, BuildConfig(name, num_shards, partitioner, factory),
                     show_progress=False)
    directory, _ = resolve_version(root, name)
    return [Shard.load(shard_dir(directory, s), device="cpu") for s in range(num_shards)]


@contextmanager
def gateway_client(shards: list[Shard], config: GatewayConfig | None = None,
                   encoder_loader=None) -> Iterator[TestClient]:
    shard_client, replicas = InProcessShardClient.of(shards)
    config = config or GatewayConfig(encoder=EncoderSettings(load=encoder_loader is not None, backend="thread"))
    setup = GatewaySetup(config, replicas, shard_client=shard_client, encoder_loader=encoder_loader)
    with TestClient(create_app(setup)) as client:
        yield client
