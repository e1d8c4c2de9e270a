"""The build command ``shardrag tune --rebuild`` suggests names the chosen structure's graph
breadth: every HNSW candidate was linked with the published version's ``ef_construction`` or a
wider one, and ``--factory`` alone would build with FAISS's 40."""

from index_shards.tuning import structures_to_try
from serving.cli.tune_report import breadth_flag


def flags(factory: str, published_breadth: int | None) -> dict[str, str]:
    return {s.label: breadth_flag(s.ef_construction) for s in structures_to_try(factory, 8, 5_000, published_breadth)}


def test_an_hnsw_suggestion_carries_the_breadth_it_was_tuned_with():
    built_wide = flags("HNSW32", 100)
    assert built_wide["HNSW16 efC100"] == " --ef-construction 100"  # the published breadth, kept
    assert built_wide["HNSW16 efC200"] == " --ef-construction 200"  # the wider one tried
    assert flags("IVF64,Flat", None)["IVF16,Flat"] == ""  # no graph to link
    from_flat = flags("Flat", None)
    assert from_flat["HNSW16"] == ""  # FAISS's 40: no flag needed
    assert from_flat["HNSW32 efC100"] == " --ef-construction 100"
    assert from_flat["Flat"] == ""
