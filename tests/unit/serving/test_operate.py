"""Operator views without processes: the status table and its exit verdict, the demo corpus
sample spread over every module."""

from __future__ import annotations

from serving.cli.operate import render_status
from serving.local.demo_corpus import python_docs_corpus


def cluster_json(healthy: list[list[bool]]) -> dict:
    shards = []
    for shard, replicas in enumerate(healthy):
        shards.append({"shard": shard, "count": 10, "healthy_replicas": sum(replicas), "replicas": [
            {"url": f"http://127.0.0.1:{9000 + 10 * shard + r}", "healthy": up, "latency_ms": 1.5,
             "ejection": {"ejected": not up}, "restarts": 2 if not up else 0, "last_exit_code": -9 if not up else None,
             "versions": [{"id": "v1", "state": "ready"}] if up else [], **({} if up else {"error": "refused"})}
            for r, up in enumerate(replicas)]})
    return {"collection": "docs", "num_shards": len(shards), "factory": "Flat", "shards": shards,
            "rollout": {"active": "v1", "staged": "v2", "previous": None},
            "hedging": {"enabled": True, "calls": 100, "hedges_fired": 3, "hedges_won": 1, "retries": 0,
                        "budget_exhausted": 0},
            "encoders": {"v1": {"state": "ready"}},
            "generators": {"in_flight": {"g1": 0, "g2": 1}, "down": ["g2"], "routed": 5, "spilled": 1,
                           "failed_over": 1}}


def test_the_table_names_every_replica_and_flags_a_shard_without_one_healthy():
    table, served = render_status(cluster_json([[True, True], [True, False]]))
    assert served
    assert table.count("http://127.0.0.1:") == 4 and "DOWN" in table and "staged v2" in table
    assert "-9" in table and "refused" in table and "1 down" in table
    table, served = render_status(cluster_json([[True, True], [False, False]]))
    assert not served and "shard 1 has no healthy replica" in table



def test_columns_line_up_whatever_the_replica_urls_length():
    cluster = cluster_json([[True, True]])
    cluster["shards"][0]["replicas"][1]["url"] = "http://127.0.0.1:40377/c/a-long-collection-name/0"  # a node's
    lines = render_status(cluster)[0].splitlines()
    header = next(line for line in lines if line.lstrip().startswith("shard"))
    rows = [line for line in lines if "http://" in line]
    assert {row.index(" up ") for row in rows} == {header.index("health") - 1}


def test_a_replica_building_its_lexical_index_says_so():
    cluster = cluster_json([[True, True]])
    assert "lexical index building" not in render_status(cluster)[0]
    cluster["shards"][0]["replicas"][1]["versions"][0]["lexical_index"] = "building"
    rows = [row for row in render_status(cluster)[0].splitlines() if "lexical index building: v1" in row]
    assert len(rows) == 1 and ":9001" in rows[0]


def test_the_demo_sample_spreads_over_modules_and_the_full_corpus_keeps_module_docstrings():
    everything = python_docs_corpus()
    ids = {d.doc_id for d in everything}
    assert {"py/csv#0", "py/argparse#0", "py/urllib.request#0"} <= ids
    sample = python_docs_corpus(300)
    modules = {str(d.metadata.get("module", "topics")).split(".")[0] for d in sample}
    first_300 = {str(d.metadata.get("module", "topics")).split(".")[0] for d in everything[:300]}
    assert len(sample) == 300 and len(modules) > 100 and len(first_300) < 10
    assert "py/csv#0" in {d.doc_id for d in sample}  # each module's own docstring comes first


def test_the_demo_corpus_reads_packages_skips_methods_and_deprecated_modules_and_titles_sections():
    everything = {d.doc_id: d for d in python_docs_corpus()}
    # a package's docstring lives in its __init__.py: these were missing once
    packages = {"py/re#0", "py/json#0", "py/logging#0", "py/collections#0", "py/sqlite3#0", "py/json.loads#0"}
    assert packages <= set(everything)
    assert not any(i.startswith(("py/distutils", "py/cgi.", "py/cgi#", "py/telnetlib")) for i in everything)
    assert "py/cmd.Cmd#0" in everything and "py/cmd.Cmd.parseline#0" not in everything  # no stdlib methods
    assert "py/builtins.list.sort#0" in everything  # the built-in types' methods stay
    assert everything["py/builtins.sorted#0"].text.startswith("sorted(iterable, /, *, key=None, reverse=False): ")
    assert everything["py/builtins.list.sort#0"].title == "list.sort — method of the built-in list type"
    sort_passages = [d for i, d in everything.items() if i.startswith("topic/typesseq#") and "sorts the list" in d.text]
    assert sort_passages and all(d.title.endswith(" › Lists") for d in sort_passages)
    topic_words = [d.text.split()[0] for i, d in everything.items() if i.startswith("topic/")]
    assert not any(len(w) >= 3 and set(w) <= set("=-*~^") for w in topic_words)  # underlines are not text
