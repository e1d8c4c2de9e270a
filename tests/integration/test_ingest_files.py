"""``shardrag ingest PATH…`` on a folder of mixed files (Markdown, text, HTML, PDF — made here)
into a real local cluster that embeds with the real MiniLM: a re-run writes nothing, an edited
file's passages are replaced and no other's touched, a deleted file's passages go with --sync, an
unreadable file stops the run before any write, naming the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.client import ShardragClient
from serving.cli import main
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.pdf import write_pdf

pytestmark = pytest.mark.slow
COLLECTION = "files"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, msmarco) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("ingest") / "root"
    build_collection(root, msmarco.documents[:200], msmarco.vectors[:200], msmarco.version,
                     BuildConfig(COLLECTION, 2), show_progress=False)
    with LocalCluster(root, COLLECTION, replicas=2, gateway=GatewayConfig(),
                      workdir=tmp_path_factory.mktemp("work")) as running:
        yield running


def write_folder(folder: Path) -> None:
    (folder / "guide").mkdir(parents=True)
    (folder / "guide" / "install.md").write_text(
        "# Installing\nShardrag installs with pip into a virtual environment.\n\n"
        "## On Linux\nUse the CPU wheel of torch so that no CUDA build is downloaded.\n\n"
        "# Running\n" + "The local cluster starts shards, replicas and a gateway on loopback. " * 40)
    (folder / "notes.txt").write_text("Glaciers carve fjords over millennia, grinding the valley floor.")
    (folder / "page.html").write_text(
        "<html><head><title>t</title><style>p{}</style></head><body><h1>Volcanoes</h1>"
        "<p>Volcanoes build islands from basalt.</p><script>ignored()</script>"
        "<h2>Hotspots</h2><p>Hawaii sits over a mantle hotspot.</p></body></html>")
    write_pdf(folder / "report.pdf", ["Rivers cut canyons through sandstone.", "Deltas form where rivers slow."])
    (folder / "image.png").write_bytes(b"\x89PNG not read")  # a kind ingest does not read: skipped in a folder


def ingest(cluster: LocalCluster, *args: str, capsys) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["ingest", *args, "--collection", COLLECTION, "--url", cluster.gateway_url, "--quiet"])
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if code == 0 else None), err


def applied(cluster: LocalCluster) -> list[int]:
    """Every replica's applied seq: unchanged means no write reached any replica."""
    view = httpx.get(f"{cluster.gateway_url}/v1/cluster", timeout=30).json()
    seqs: list[int] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            seqs.extend([int(node["applied_seq"])] if "applied_seq" in node else [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(view)
    return seqs


def passages_of(client: ShardragClient, source: Path) -> dict[str, dict[str, Any]]:
    """Every live passage of ``source``, by id, with metadata and seq: a query filtered to it (a
    filter this narrow is an exact scan of what it keeps, so k=100 returns all of them)."""
    hits = client.query(text="anything at all", k=100, with_metadata=True,
                        filter={"must": [{"key": "source", "match": {"value": str(source.resolve())}}]})["hits"]
    return {h["doc_id"]: client.get(h["doc_id"]) for h in hits}


def test_ingest_files_is_idempotent_replaces_edits_and_syncs_deletions(cluster, tmp_path, capsys):
    folder = tmp_path / "docs"
    write_folder(folder)
    code, first, err = ingest(cluster, str(folder), capsys=capsys)
    assert code == 0, err
    assert first["files"] == 4 and first["written_files"] == 4 and first["passages_deleted"] == 0
    client = ShardragClient(cluster.gateway_url).collection(COLLECTION)
    files = {name: folder / name for name in ("guide/install.md", "notes.txt", "page.html", "report.pdf")}
    before = {name: passages_of(client, path) for name, path in files.items()}
    assert sum(len(p) for p in before.values()) == first["passages_written"]
    install = before["guide/install.md"]
    assert len(install) >= 3 and {p["metadata"].get("heading") for p in install.values()} >= {
        "Installing", "Installing > On Linux", "Running"}
    assert {p["metadata"]["page"] for p in before["report.pdf"].values()} == {1, 2}
    assert [p["metadata"]["heading"] for p in before["page.html"].values()] in (
        ["Volcanoes", "Volcanoes > Hotspots"], ["Volcanoes > Hotspots", "Volcanoes"])
    assert "ignored" not in " ".join(p["text"] for p in before["page.html"].values())
    hit = client.query(text="which rivers cut canyons", k=1, with_metadata=True)["hits"][0]
    assert hit["metadata"]["source"] == str(files["report.pdf"].resolve()) and hit["metadata"]["page"] == 1

    # a re-run: nothing changed, nothing written
    seqs = applied(cluster)
    code, again, err = ingest(cluster, str(folder), "--sync", capsys=capsys)
    assert code == 0, err
    assert again["unchanged"] == 4 and again["passages_written"] == 0 and again["passages_deleted"] == 0
    assert applied(cluster) == seqs

    # one file edited: its passages replaced, no other file's touched (same ids, same seqs)
    files["notes.txt"].write_text("Glaciers retreat as the climate warms; their meltwater feeds rivers.")
    code, edited, err = ingest(cluster, str(folder), capsys=capsys)
    assert code == 0, err
    assert edited["written_files"] == 1 and edited["unchanged"] == 3 and edited["passages_deleted"] == 1
    after = {name: passages_of(client, path) for name, path in files.items()}
    assert set(after["notes.txt"]).isdisjoint(before["notes.txt"])
    assert [p["text"] for p in after["notes.txt"].values()] == [files["notes.txt"].read_text()]
    for name in ("guide/install.md", "page.html", "report.pdf"):
        assert {i: p["seq"] for i, p in after[name].items()} == {i: p["seq"] for i, p in before[name].items()}

    # one file deleted: --sync removes its passages, only those
    files["page.html"].unlink()
    code, synced, err = ingest(cluster, str(folder), "--sync", capsys=capsys)
    assert code == 0, err
    assert synced["passages_deleted"] == len(before["page.html"]) and synced["passages_written"] == 0
    assert passages_of(client, files["page.html"]) == {}
    assert {i: p["seq"] for i, p in passages_of(client, files["report.pdf"]).items()} == {
        i: p["seq"] for i, p in before["report.pdf"].items()}

    # a file without text (a byte-order mark and blanks): counted as such, nothing written for it;
    # an edited file emptied: its old passages go
    (folder / "blank.txt").write_text("\ufeff \n\t\n", encoding="utf-8")
    files["notes.txt"].write_text("  \n")
    code, emptied, err = ingest(cluster, str(folder), capsys=capsys)
    assert code == 0, err
    assert (emptied["empty_files"], emptied["written_files"], emptied["passages_written"]) == (2, 0, 0)
    assert emptied["passages_deleted"] == 1 and passages_of(client, files["notes.txt"]) == {}
    assert "2 without text" in err

    # an unreadable file: the run stops before any write and names it
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    (folder / "notes.txt").write_text("an edit that must not be written: the run fails first")
    seqs = applied(cluster)
    code, _, err = ingest(cluster, str(folder), capsys=capsys)
    assert code != 0 and "broken.pdf" in err and "not a readable PDF" in err
    assert applied(cluster) == seqs
    code, _, err = ingest(cluster, str(tmp_path / "missing"), capsys=capsys)
    assert code != 0 and "missing: no such file or folder" in err
    client.close()
