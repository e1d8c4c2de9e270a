"""The build command ``shardrag tune --rebuild`` suggests keeps the published graph's breadth: the
candidates were linked with it, and ``--factory`` alone would build with FAISS's 40."""

from index_shards.manifest import CollectionManifest
from retrieval.types import EmbeddingVersion
from serving.cli.tune_report import breadth_flag


def manifest(factory: str, ef_construction: int | None) -> CollectionManifest:
    return CollectionManifest("c", EmbeddingVersion("v", "v" * 64, 8), 1, "hash", factory, "ip", 10, ("x",),
                              ef_construction=ef_construction)


def test_an_hnsw_suggestion_carries_the_publishedbreadth_flag():
    assert breadth_flag(manifest("HNSW32", 100), "HNSW16") == " --ef-construction 100"
    assert breadth_flag(manifest("HNSW32", 100), "IVF64,Flat") == ""  # no graph to link
    assert breadth_flag(manifest("HNSW32", None), "HNSW16") == ""  # FAISS's 40 either way
    assert breadth_flag(manifest("Flat", None), "HNSW32") == ""
